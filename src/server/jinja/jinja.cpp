#include "server/jinja/jinja.h"

#include <ctime>

#include "server/jinja/eval.h"
#include "server/jinja/parser.h"

namespace lragent::server::jinja {

Result<Template> Template::parse(std::string_view source) {
  LRA_ASSIGN_OR_RETURN(StmtList program, parse_template(source));
  Template t;
  t.program_ = std::make_shared<const StmtList>(std::move(program));
  return t;
}

Result<std::string> Template::render(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  if (!program_) return Error{ErrorCode::kInvalidArgument, "render() of a template that was not parsed"};
  Interp interp(options);
  return interp.render(*program_, variables);
}

std::string strftime_local_now(const std::string& format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  // strftime gives 0 both for "too small a buffer" and for an empty result: grow a few times.
  for (size_t size = 256; size <= (size_t{1} << 16); size *= 4) {
    std::string buf(size, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
    if (n > 0 || format.empty()) {
      buf.resize(n);
      return buf;
    }
  }
  return "";
}

}  // namespace lragent::server::jinja
