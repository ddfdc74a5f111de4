# Cross-compiling memkit for 64-bit Windows with Debian's MinGW-w64 (g++-mingw-w64-x86-64-posix:
# the POSIX threading model, which std::thread and std::mutex need) and running the results under
# Wine (wine64). Used by the `windows` preset; tools/install-deps --windows installs both.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

set(MEMKIT_MINGW_PREFIX x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${MEMKIT_MINGW_PREFIX}-gcc-posix)
set(CMAKE_CXX_COMPILER ${MEMKIT_MINGW_PREFIX}-g++-posix)
set(CMAKE_RC_COMPILER ${MEMKIT_MINGW_PREFIX}-windres)

# Libraries and packages from the cross sysroot only (never the host's Linux builds of GoogleTest);
# programs from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${MEMKIT_MINGW_PREFIX})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# The C++ runtime, libgcc and winpthreads linked statically: every .exe runs under Wine (or on a
# Windows machine) without copying MinGW's DLLs next to it.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-static")

# ctest (and GoogleTest's test discovery) run the programs through Wine. Debian's wine64 package
# installs the loader under /usr/lib/wine; the `wine` command comes from the `wine` package.
find_program(MEMKIT_WINE NAMES wine64 wine wine-stable PATHS /usr/lib/wine NO_CMAKE_FIND_ROOT_PATH)
if(MEMKIT_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MEMKIT_WINE})
endif()

# printf and friends with C99 formats (%zu, %llu) from MinGW's own implementation, not msvcrt's.
# GCC still checks functions declared format(printf) against msvcrt's formats on this target, where
# they would take %zu as an error: the format check is left to the Linux builds.
set(CMAKE_C_FLAGS_INIT "-D__USE_MINGW_ANSI_STDIO=1 -Wno-format")
set(CMAKE_CXX_FLAGS_INIT "-D__USE_MINGW_ANSI_STDIO=1 -Wno-format")
