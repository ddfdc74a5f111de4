// g++ workload: a template-heavy translation unit. The compiler, not this program, is what runs:
// the workload compiles it with -O2 and compares the object file's bytes between allocators.
// MEMKIT_WORKLOAD_SCALE sets how many distinct instantiation sets the compiler must build.
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <ranges>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>

#ifndef MEMKIT_WORKLOAD_SCALE
#define MEMKIT_WORKLOAD_SCALE 1
#endif

namespace workload {

template <int N>
struct tag {};

// A compile-time recursion that instantiates a chain of distinct types.
template <int Depth, class T>
struct nest {
  using type = std::tuple<typename nest<Depth - 1, T>::type, std::optional<T>>;
};
template <class T>
struct nest<0, T> {
  using type = T;
};

template <int N>
struct record {
  std::string name;
  std::vector<int> values;
  std::map<std::string, std::variant<int, double, std::string>> fields;
  typename nest<6, tag<N>>::type deep;
  auto operator<=>(const record& other) const { return name <=> other.name; }
  bool operator==(const record& other) const { return name == other.name; }
};

template <int N>
std::string summarize(const std::vector<record<N>>& records) {
  std::unordered_map<std::string, std::vector<int>> groups;
  for (const auto& r : records) {
    auto& g = groups[r.name.substr(0, 3)];
    g.insert(g.end(), r.values.begin(), r.values.end());
  }
  std::set<std::pair<std::string, long>> totals;
  for (auto& [key, values] : groups) {
    std::ranges::sort(values);
    auto even = values | std::views::filter([](int v) { return v % 2 == 0; }) |
                std::views::transform([](int v) { return static_cast<long>(v) * N; });
    totals.emplace(key, std::accumulate(even.begin(), even.end(), 0L));
  }
  std::string out;
  for (const auto& [key, total] : totals) {
    out += key + "=" + std::to_string(total) + ";";
    for (const auto& r : records)
      for (const auto& [field, value] : r.fields)
        out += std::visit([&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>) return field + v;
          else return field + std::to_string(v);
        }, value);
  }
  return out;
}

template <int N>
std::function<std::string(int)> make_step() {
  return [](int count) {
    std::vector<record<N>> records;
    for (int i = 0; i < count; ++i) {
      record<N> r{"r" + std::to_string(i * N), {i, i * 2, i * N}, {}, {}};
      r.fields.emplace("a", i);
      r.fields.emplace("b", i * 0.5);
      r.fields.emplace("c", std::to_string(i));
      records.push_back(std::move(r));
    }
    std::ranges::sort(records);
    auto unique_end = std::unique(records.begin(), records.end());
    records.erase(unique_end, records.end());
    return summarize(records);
  };
}

template <int... N>
std::vector<std::function<std::string(int)>> make_steps(std::integer_sequence<int, N...>) {
  return {make_step<N>()...};
}

}  // namespace workload

std::size_t run_workload(int count) {
  auto steps = workload::make_steps(std::make_integer_sequence<int, MEMKIT_WORKLOAD_SCALE>{});
  std::size_t total = 0;
  for (auto& step : steps) total += step(count).size();
  return total;
}
