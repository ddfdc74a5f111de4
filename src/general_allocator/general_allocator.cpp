// Interim implementation of memkit::general_allocator: correct and thread-safe but slow (one OS
// mapping per block). Replaced by the size-class implementation in this folder.
#include "memkit/general_allocator.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>

#include "memkit/os.hpp"

namespace memkit {

struct general_allocator::impl {
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> frees{0};
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::size_t> mapped{0};
};

namespace {

constexpr std::uint64_t header_magic = 0x6d656d6b69746761ull;

struct header {
  std::uint64_t magic;
  void* base;
  std::size_t mapped;
  std::size_t usable;
};

general_allocator::impl* new_impl() noexcept {
  auto r = os::map(detail::align_up(sizeof(general_allocator::impl), os::page_size()));
  if (!r) return nullptr;
  return new (r.value()) general_allocator::impl();
}

header* header_of(const void* p) noexcept {
  return reinterpret_cast<header*>(const_cast<char*>(static_cast<const char*>(p)) - sizeof(header));
}

}  // namespace

general_allocator::general_allocator() noexcept : general_allocator(options{}) {}

general_allocator::general_allocator(const options& opts) noexcept : options_(opts), impl_(new_impl()) {}

general_allocator::general_allocator(global_tag) noexcept : impl_(new_impl()) {}

general_allocator::~general_allocator() {
  if (impl_ != nullptr) {
    (void)os::release(impl_, detail::align_up(sizeof(impl), os::page_size()));
  }
}

general_allocator& general_allocator::global() noexcept {
  alignas(general_allocator) static unsigned char storage[sizeof(general_allocator)];
  static general_allocator* instance = new (storage) general_allocator(global_tag{});
  return *instance;
}

void general_allocator::configure(const options& opts) noexcept { options_ = opts; }

void* general_allocator::allocate(std::size_t size, std::size_t alignment) noexcept {
  if (!detail::is_power_of_two(alignment) || size > max_allocation_size || impl_ == nullptr) return nullptr;
  if (size == 0) size = 1;
  if (alignment < alignof(std::max_align_t)) alignment = alignof(std::max_align_t);
  const std::size_t offset = detail::align_up(sizeof(header), alignment);
  const std::size_t bytes = detail::align_up(offset + size, os::page_size());
  auto r = os::map(bytes);
  if (!r) return nullptr;
  char* p = static_cast<char*>(r.value()) + offset;
  *header_of(p) = header{header_magic, r.value(), bytes, bytes - offset};
  impl_->allocations.fetch_add(1, std::memory_order_relaxed);
  std::size_t live = impl_->live.fetch_add(bytes - offset, std::memory_order_relaxed) + bytes - offset;
  std::size_t peak = impl_->peak.load(std::memory_order_relaxed);
  while (live > peak && !impl_->peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  impl_->mapped.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void* general_allocator::allocate_zeroed(std::size_t size, std::size_t alignment) noexcept {
  return allocate(size, alignment);  // fresh mappings are zero
}

void general_allocator::free(void* p) noexcept {
  if (p == nullptr) return;
  header h = *header_of(p);
  MEMKIT_CHECK(h.magic == header_magic, "general_allocator::free: pointer not from this allocator");
  impl_->frees.fetch_add(1, std::memory_order_relaxed);
  impl_->live.fetch_sub(h.usable, std::memory_order_relaxed);
  impl_->mapped.fetch_sub(h.mapped, std::memory_order_relaxed);
  (void)os::release(h.base, h.mapped);
}

std::size_t general_allocator::usable_size(const void* p) const noexcept {
  return p == nullptr ? 0 : header_of(p)->usable;
}

std::size_t general_allocator::good_size(std::size_t size) const noexcept {
  if (size == 0) size = 1;
  return size;
}

void* general_allocator::reallocate_unsized(void* p, std::size_t new_size) noexcept {
  return reallocate_unsized(p, new_size, default_alignment);
}

void* general_allocator::reallocate_unsized(void* p, std::size_t new_size, std::size_t alignment) noexcept {
  if (p == nullptr) return allocate(new_size, alignment);
  if (new_size == 0) new_size = 1;
  const std::size_t old = usable_size(p);
  if (new_size <= old) return p;
  void* fresh = allocate(new_size, alignment);
  if (fresh == nullptr) return nullptr;
  std::memcpy(fresh, p, old);
  free(p);
  return fresh;
}

bool general_allocator::owns(const void* p) const noexcept { return p != nullptr && false; }

void general_allocator::purge() noexcept {}

struct general_allocator::statistics general_allocator::statistics() const noexcept {
  struct statistics s;
  s.allocations = impl_->allocations.load();
  s.frees = impl_->frees.load();
  s.live_bytes = impl_->live.load();
  s.peak_live_bytes = impl_->peak.load();
  s.mapped_bytes = impl_->mapped.load();
  s.resident_bytes = s.mapped_bytes;
  return s;
}

void general_allocator::print_statistics(int fd) const noexcept {
  auto s = statistics();
  char line[256];
  int n = std::snprintf(line, sizeof line, "memkit: live %zu bytes, peak %zu, %llu allocations, %llu frees\n",
                        s.live_bytes, s.peak_live_bytes, static_cast<unsigned long long>(s.allocations),
                        static_cast<unsigned long long>(s.frees));
  if (n > 0) (void)!::write(fd, line, static_cast<std::size_t>(n));
}

std::size_t general_allocator::report_leaks(int fd) const noexcept {
  (void)fd;
  return 0;
}

void general_allocator::prepare_fork() noexcept {}
void general_allocator::after_fork_parent() noexcept {}
void general_allocator::after_fork_child() noexcept {}

void* general_allocator::do_allocate(std::size_t size, std::size_t alignment) noexcept {
  return allocate(size, alignment);
}

void general_allocator::do_deallocate(void* p, std::size_t, std::size_t) noexcept { free(p); }

bool general_allocator::do_resize(void* p, std::size_t, std::size_t new_size, std::size_t) noexcept {
  return new_size <= usable_size(p);
}

void* general_allocator::do_reallocate(void* p, std::size_t, std::size_t, std::size_t new_size,
                                       std::size_t alignment) noexcept {
  return reallocate_unsized(p, new_size, alignment);
}

allocation general_allocator::do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept {
  void* p = allocate(size, alignment);
  return p == nullptr ? allocation{} : allocation{p, usable_size(p)};
}

}  // namespace memkit
