// virtual_arena in a few lines: a scratch arena for one "frame" of work, rewound with a scope,
// reset in O(1), and used as a memkit::allocator. Returns 0 when everything behaved as documented.
#include <memkit/virtual_arena.hpp>

#include <cstdio>
#include <cstring>
#include <memory_resource>
#include <vector>

namespace {

struct token {
  int kind;
  const char* text;
  std::size_t length;
};

// Splits `input` on spaces into tokens that live in the arena; returns how many there are.
std::size_t tokenize(memkit::virtual_arena& arena, const char* input, token** out) {
  token* first = nullptr;
  std::size_t count = 0;
  for (const char* p = input; *p != '\0';) {
    while (*p == ' ') ++p;
    const char* start = p;
    while (*p != '\0' && *p != ' ') ++p;
    if (p == start) break;
    // Copy the text next to the tokens: everything this function makes lives in the arena.
    char* text = static_cast<char*>(arena.allocate(static_cast<std::size_t>(p - start) + 1, 1));
    token* t = arena.create<token>(token{static_cast<int>(count), text, static_cast<std::size_t>(p - start)});
    if (text == nullptr || t == nullptr) return 0;  // reservation exhausted or commit refused
    std::memcpy(text, start, t->length);
    text[t->length] = '\0';
    if (first == nullptr) first = t;
    ++count;
  }
  *out = first;
  return count;
}

}  // namespace

int main() {
  // 1 GiB of address space; nothing is committed until it is used.
  memkit::virtual_arena arena(std::size_t{1} << 30);
  if (arena.committed() != 0) return 1;

  for (int frame = 0; frame < 3; ++frame) {
    memkit::virtual_arena::scope scratch(arena);  // everything below is freed at the closing brace
    token* tokens = nullptr;
    const std::size_t count = tokenize(arena, "reserve a huge range and commit it on demand", &tokens);
    if (count != 9 || std::strcmp(tokens->text, "reserve") != 0) return 2;
  }
  if (arena.used() != 0) return 3;  // every frame's memory came back
  if (arena.high_water() == 0) return 4;

  // As an allocator behind standard containers (through std::pmr here).
  memkit::allocator_resource resource(arena);
  {
    std::pmr::vector<int> numbers(&resource);
    for (int i = 0; i < 100000; ++i) numbers.push_back(i);
    if (numbers[99999] != 99999) return 5;
  }

  // The most recent allocation grows in place: no copy.
  auto* buffer = static_cast<char*>(arena.allocate(64));
  std::strcpy(buffer, "grows in place");
  if (!arena.resize(buffer, 64, 1 << 20) || std::strcmp(buffer, "grows in place") != 0) return 6;

  const auto stats = arena.statistics();
  std::printf("reserved %zu MiB, committed %zu KiB, used %zu KiB, high water %zu KiB\n", stats.reserved >> 20,
              stats.committed >> 10, stats.used >> 10, stats.high_water >> 10);

  arena.reset();  // O(1): cursor back to the start, committed memory beyond retained_on_reset given back
  if (arena.used() != 0 || arena.committed() != 0) return 7;

  // Exhaustion is a null pointer, never an exception or a crash.
  memkit::virtual_arena small(4096);  // rounded up to whole pages of the system
  if (small.allocate(small.reserved() + 1) != nullptr) return 8;
  std::puts("virtual_arena example: ok");
  return 0;
}
