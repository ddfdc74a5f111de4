#include "memkit/tracking_allocator.hpp"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "memkit/detail/stack_trace.hpp"
#include "report.hpp"

namespace memkit {
namespace {

constexpr std::size_t max_stack_depth = 32;

std::string format_bytes(std::uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  char buffer[32];
  if (unit == 0) std::snprintf(buffer, sizeof buffer, "%" PRIu64 " B", bytes);
  else std::snprintf(buffer, sizeof buffer, "%.1f %s", value, units[unit]);
  return buffer;
}

std::size_t bucket_of(std::size_t size) noexcept {
  return size == 0 ? 0 : static_cast<std::size_t>(std::bit_width(size) - 1);
}

}  // namespace

std::string tracking_statistics::to_string() const {
  std::string out;
  char line[256];
  auto add = [&](const char* format, auto... values) {
    std::snprintf(line, sizeof line, format, values...);
    out += line;
  };
  add("  allocations     %" PRIu64 " (failed %" PRIu64 ", refused by budget %" PRIu64
      ", injected failures %" PRIu64 ")\n",
      allocations, failed_allocations, budget_refusals, injected_failures);
  add("  deallocations   %" PRIu64 "\n", deallocations);
  add("  reallocations   %" PRIu64 " (%" PRIu64 " in place)\n", reallocations, reallocations_in_place);
  add("  resizes         %" PRIu64 " attempted, %" PRIu64 " in place\n", resize_attempts, resizes_in_place);
  add("  live            %" PRIu64 " blocks, %s (peak %s)\n", live_blocks, format_bytes(live_bytes).c_str(),
      format_bytes(peak_bytes).c_str());
  add("  total requested %s\n", format_bytes(total_bytes).c_str());
  add("  errors          %" PRIu64 "\n", errors);
  std::uint64_t largest = 0;
  for (auto count : size_histogram) largest = std::max(largest, count);
  if (largest == 0) return out;
  out += "  sizes (bytes)\n";
  for (std::size_t k = 0; k < histogram_buckets; ++k) {
    if (size_histogram[k] == 0) continue;
    const auto bar = static_cast<int>(1 + 39 * size_histogram[k] / largest);
    const std::string low = format_bytes(std::uint64_t{1} << k);
    add("    >= %-9s %10" PRIu64 " %.*s\n", low.c_str(), size_histogram[k], bar,
        "########################################");
  }
  return out;
}

tracking_allocator::tracking_allocator(allocator& upstream, tracking_options options)
    : upstream_(&upstream), options_(options) {
  options_.stack_depth = std::min(options_.stack_depth, max_stack_depth);
}

tracking_allocator::~tracking_allocator() {
  if (!options_.report_leaks_at_destruction) return;
  std::lock_guard lock(mutex_);
  if (blocks_.empty()) return;
  print_leaks_locked(options_.report_fd);
}

tracking_statistics tracking_allocator::statistics() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::string tracking_allocator::report() const {
  const tracking_statistics snapshot = statistics();
  return std::string("memkit::") + options_.name + ":\n" + snapshot.to_string();
}

void tracking_allocator::reset_statistics() {
  std::lock_guard lock(mutex_);
  const auto blocks = stats_.live_blocks;
  const auto bytes = stats_.live_bytes;
  stats_ = {};
  stats_.live_blocks = blocks;
  stats_.live_bytes = bytes;
  stats_.peak_bytes = bytes;
}

void tracking_allocator::set_budget(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  options_.budget = bytes;
}

std::size_t tracking_allocator::budget() const {
  std::lock_guard lock(mutex_);
  return options_.budget;
}

void tracking_allocator::fail_nth_allocation(std::uint64_t n) {
  std::lock_guard lock(mutex_);
  fail_countdown_ = n;
}

void tracking_allocator::fail_all_allocations(bool on) {
  std::lock_guard lock(mutex_);
  fail_all_ = on;
}

std::vector<tracking_allocator::block_info> tracking_allocator::live_blocks() const {
  std::vector<block_info> out;
  std::lock_guard lock(mutex_);
  out.reserve(blocks_.size());
  for (const auto& [p, r] : blocks_) out.push_back({p, r.size, r.usable_size, r.alignment, r.sequence});
  std::sort(out.begin(), out.end(), [](const block_info& a, const block_info& b) { return a.sequence < b.sequence; });
  return out;
}

std::size_t tracking_allocator::print_leaks(int fd) const {
  std::lock_guard lock(mutex_);
  return print_leaks_locked(fd);
}

std::size_t tracking_allocator::print_leaks_locked(int fd) const {
  std::vector<std::pair<void*, const record*>> leaks;
  leaks.reserve(blocks_.size());
  std::uint64_t bytes = 0;
  for (const auto& [p, r] : blocks_) {
    leaks.emplace_back(p, &r);
    bytes += r.size;
  }
  std::sort(leaks.begin(), leaks.end(),
            [](const auto& a, const auto& b) { return a.second->sequence < b.second->sequence; });
  diagnostics::print(fd, "memkit::%s: %zu block(s) leaked, %s\n", options_.name, leaks.size(), format_bytes(bytes).c_str());
  for (const auto& [p, r] : leaks) {
    diagnostics::print(fd, "  allocation #%" PRIu64 ": " MEMKIT_ADDRESS ", %zu bytes, alignment %zu\n", r->sequence,
                       diagnostics::address(p), r->size,
             r->alignment);
    if (r->frames) detail::print_stack_trace(fd, r->frames.get(), r->frame_count);
  }
  return leaks.size();
}

std::string tracking_allocator::last_error() const {
  std::lock_guard lock(mutex_);
  return last_error_;
}

bool tracking_allocator::admit(std::size_t added) noexcept {
  if (fail_all_ || (fail_countdown_ > 0 && --fail_countdown_ == 0)) {
    ++stats_.injected_failures;
    return false;
  }
  if (added > options_.budget || stats_.live_bytes > options_.budget - added) {
    ++stats_.budget_refusals;
    return false;
  }
  return true;
}

void tracking_allocator::note_size(std::size_t size) noexcept {
  ++stats_.size_histogram[bucket_of(size)];
  stats_.total_bytes += size;
}

void tracking_allocator::capture(record& r) const noexcept {
  r.frame_count = 0;
  if (!options_.capture_stack_traces) return;
  r.frames.reset(new (std::nothrow) void*[options_.stack_depth]);
  if (r.frames) r.frame_count = detail::capture_stack_trace(r.frames.get(), options_.stack_depth, 3);
}

void tracking_allocator::note_allocation(void* p, std::size_t size, std::size_t usable_size,
                                         std::size_t alignment) {
  record r{size, usable_size, alignment, ++sequence_, nullptr, 0};
  capture(r);
  blocks_.insert_or_assign(p, std::move(r));
  ++stats_.allocations;
  ++stats_.live_blocks;
  stats_.live_bytes += size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  note_size(size);
}

void tracking_allocator::error(const char* message, const record* block) noexcept {
  ++stats_.errors;
  try {
    last_error_ = message;
  } catch (...) {  // keep the previous message rather than fail inside a deallocation
  }
  if (!options_.abort_on_error) return;
  diagnostics::print(options_.report_fd, "memkit::%s: %s\n", options_.name, message);
  if (block != nullptr && block->frames) {
    diagnostics::print(options_.report_fd, "  the block was allocated at:\n");
    detail::print_stack_trace(options_.report_fd, block->frames.get(), block->frame_count);
  }
  void* frames[max_stack_depth];
  const std::size_t count = detail::capture_stack_trace(frames, max_stack_depth, 1);
  diagnostics::print(options_.report_fd, "  the mismatched call is at:\n");
  detail::print_stack_trace(options_.report_fd, frames, count);
  diagnostics::finish_misuse_report(true);
}

tracking_allocator::record* tracking_allocator::find_checked(void* p, std::size_t size, std::size_t alignment,
                                                             const char* operation) noexcept {
  auto it = blocks_.find(p);
  char message[256];
  if (it == blocks_.end()) {
    std::snprintf(message, sizeof message, "%s of " MEMKIT_ADDRESS ", which this allocator did not allocate (or already freed)",
                  operation, diagnostics::address(p));
    error(message, nullptr);
    return nullptr;
  }
  record& r = it->second;
  if (size < r.size || size > r.usable_size) {
    std::snprintf(message, sizeof message,
                  "%s of " MEMKIT_ADDRESS " with size %zu, but allocation #%" PRIu64 " was %zu bytes (usable %zu)",
                  operation, diagnostics::address(p), size, r.sequence, r.size, r.usable_size);
    error(message, &r);
  } else if (alignment != r.alignment) {
    std::snprintf(message, sizeof message,
                  "%s of " MEMKIT_ADDRESS " with alignment %zu, but allocation #%" PRIu64 " had alignment %zu", operation,
                  diagnostics::address(p),
                  alignment, r.sequence, r.alignment);
    error(message, &r);
  }
  return &r;
}

void* tracking_allocator::do_allocate(std::size_t size, std::size_t alignment) noexcept {
  return do_allocate_at_least(size, alignment).pointer;
}

allocation tracking_allocator::do_allocate_at_least(std::size_t size, std::size_t alignment) noexcept {
  std::lock_guard lock(mutex_);
  if (!admit(size)) return {};
  allocation block = upstream_->allocate_at_least(size, alignment);
  if (block.pointer == nullptr) {
    ++stats_.failed_allocations;
    return {};
  }
  // Usable bytes beyond the budget are not offered: the caller could not be charged for them.
  std::size_t usable = block.size;
  if (usable > size && stats_.live_bytes + usable > options_.budget) usable = size;
  try {
    note_allocation(block.pointer, size, usable, alignment);
  } catch (...) {  // the bookkeeping itself ran out of memory
    upstream_->deallocate(block.pointer, block.size, alignment);
    ++stats_.failed_allocations;
    return {};
  }
  return {block.pointer, usable};
}

void tracking_allocator::do_deallocate(void* p, std::size_t size, std::size_t alignment) noexcept {
  std::lock_guard lock(mutex_);
  record* r = find_checked(p, size, alignment, "deallocate");
  if (r == nullptr) return;  // unknown pointer: passing it on would corrupt the wrapped allocator
  upstream_->deallocate(p, r->usable_size, r->alignment);
  ++stats_.deallocations;
  --stats_.live_blocks;
  stats_.live_bytes -= r->size;
  blocks_.erase(p);
}

bool tracking_allocator::do_resize(void* p, std::size_t old_size, std::size_t new_size,
                                   std::size_t alignment) noexcept {
  std::lock_guard lock(mutex_);
  ++stats_.resize_attempts;
  record* r = find_checked(p, old_size, alignment, "resize");
  if (r == nullptr) return false;
  if (new_size > r->size) {
    const std::size_t added = new_size - r->size;
    if (added > options_.budget || stats_.live_bytes > options_.budget - added) {
      ++stats_.budget_refusals;
      return false;
    }
  }
  if (!upstream_->resize(p, r->usable_size, new_size, alignment)) return false;
  ++stats_.resizes_in_place;
  stats_.live_bytes = stats_.live_bytes - r->size + new_size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  if (new_size > r->size) stats_.total_bytes += new_size - r->size;
  r->size = new_size;
  r->usable_size = new_size;
  return true;
}

void* tracking_allocator::do_reallocate(void* p, std::size_t old_size, std::size_t used_bytes,
                                        std::size_t new_size, std::size_t alignment) noexcept {
  std::lock_guard lock(mutex_);
  record* r = find_checked(p, old_size, alignment, "reallocate");
  if (r == nullptr) return nullptr;
  const std::size_t added = new_size > r->size ? new_size - r->size : 0;
  if (added > 0 && !admit(added)) return nullptr;
  void* moved = upstream_->reallocate(p, r->usable_size, used_bytes, new_size, alignment);
  if (moved == nullptr) {
    ++stats_.failed_allocations;
    return nullptr;
  }
  ++stats_.reallocations;
  stats_.live_bytes = stats_.live_bytes - r->size + new_size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  stats_.total_bytes += added;
  ++stats_.size_histogram[bucket_of(new_size)];
  if (moved == p) {
    ++stats_.reallocations_in_place;
    r->size = new_size;
    r->usable_size = new_size;
    return moved;
  }
  record updated{new_size, new_size, alignment, r->sequence, std::move(r->frames), r->frame_count};
  blocks_.erase(p);
  try {
    blocks_.insert_or_assign(moved, std::move(updated));
  } catch (...) {
    // Bookkeeping failed after the move: the block is valid but untracked; say so once.
    error("reallocate: could not record the moved block (out of memory)", nullptr);
  }
  return moved;
}

}  // namespace memkit
