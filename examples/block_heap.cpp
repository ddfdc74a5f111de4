// A level's assets in a fixed 8 MiB budget: memkit::block_heap hands out blocks and sub-block
// slots, says why a request failed, shows how fragmented it is, and lists what is still live,
// grouped by the line that allocated it.
#include <memkit/block_heap.hpp>

#include <cstdio>
#include <iostream>
#include <vector>

namespace {

void* load_texture(memkit::block_heap& heap, std::size_t bytes) { return heap.allocate(bytes); }
void* load_sound(memkit::block_heap& heap) { return heap.allocate(48 * 1024); }
void* make_entity(memkit::block_heap& heap) { return heap.allocate(96); }

}  // namespace

int main() {
  memkit::block_heap_options options;
  options.track_sites = true;  // remember file, line and function of every live allocation
  options.guard_bytes = 8;     // catch overruns when blocks are freed
  memkit::block_heap heap(8u << 20, options);
  if (!heap.valid()) {
    std::fprintf(stderr, "could not reserve the region: %d\n", heap.os_error());
    return 1;
  }

  std::vector<void*> textures, sounds, entities;
  for (int i = 0; i < 6; ++i) textures.push_back(load_texture(heap, 512 * 1024));
  for (int i = 0; i < 4; ++i) sounds.push_back(load_sound(heap));
  for (int i = 0; i < 100; ++i) entities.push_back(make_entity(heap));

  // Unload every other texture: 1.5 MiB comes back, in 512 KiB holes.
  for (std::size_t i = 0; i < textures.size(); i += 2) {
    heap.deallocate(textures[i]);  // no size needed
    textures[i] = nullptr;
  }
  auto stats = heap.statistics();
  std::printf("used %zu KiB, free %zu KiB, largest free run %zu KiB, fragmentation %.2f\n",
              stats.used_bytes / 1024, stats.free_bytes / 1024, stats.largest_free_run_bytes / 1024,
              stats.fragmentation);

  // 6 MiB is free in total but not in one piece: the request fails, and the heap says it failed
  // for fragmentation. 7 MiB fails for lack of memory.
  void* six = heap.allocate(6u << 20);
  const auto six_failure = heap.last_failure();
  std::printf("6 MiB request: %s (%s)\n", six ? "served" : "refused", memkit::to_string(six_failure));
  void* seven = heap.allocate(7u << 20);
  const auto seven_failure = heap.last_failure();
  std::printf("7 MiB request: %s (%s)\n", seven ? "served" : "refused", memkit::to_string(seven_failure));

  // What is still live, and who allocated it.
  auto sites = heap.report_live_allocations(std::cout);

  bool ok = six == nullptr && six_failure == memkit::block_heap_failure::fragmentation &&
            seven == nullptr && seven_failure == memkit::block_heap_failure::out_of_memory &&
            sites.size() == 3 && heap.validate();
  for (void* p : textures) heap.deallocate(p);
  for (void* p : sounds) heap.deallocate(p);
  for (void* p : entities) heap.deallocate(p);
  ok = ok && heap.statistics().live_allocations == 0 && heap.validate();
  std::printf("%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
