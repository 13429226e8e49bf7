/* Force-included into every mlx-c translation unit.
 *
 * mlx-c formats a few error messages with std::format, using plain "{}" placeholders only.
 * Standard libraries without <format> (libstdc++ before GCC 13) get a minimal stand-in that
 * supports exactly that; everywhere else this header only includes <format>. */
#pragma once
#ifdef __cplusplus
#if __has_include(<format>)
#include <format>
#else
#include <sstream>
#include <string>
#include <string_view>

namespace std {
namespace mlx_ep_format_compat {
inline void append(std::ostringstream& out, std::string_view fmt, std::size_t& pos) {
  out << fmt.substr(pos);
  pos = fmt.size();
}
template <typename T, typename... Rest>
void append(std::ostringstream& out, std::string_view fmt, std::size_t& pos, const T& value,
            const Rest&... rest) {
  std::size_t at = fmt.find("{}", pos);
  if (at == std::string_view::npos) {
    append(out, fmt, pos);
    return;
  }
  out << fmt.substr(pos, at - pos) << value;
  pos = at + 2;
  append(out, fmt, pos, rest...);
}
}  // namespace mlx_ep_format_compat

template <typename... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  std::size_t pos = 0;
  mlx_ep_format_compat::append(out, fmt, pos, args...);
  return out.str();
}
}  // namespace std
#endif
#endif
