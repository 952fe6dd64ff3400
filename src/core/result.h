// Error handling for library code: functions return Result<T> / Status instead of
// throwing or exiting. Only the CLI/server edge turns an Error into an exit code.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace lragent {

enum class ErrorCode {
  kInvalidArgument,  // bad user input (flags, shapes, JSON values)
  kNotFound,         // missing file, tensor, token, adapter
  kCorrupt,          // malformed file contents (safetensors, tokenizer.json, config.json)
  kUnsupported,      // valid input we do not implement (architecture, DoRA, ...)
  kOutOfMemory,      // KV pool exhausted or allocation failure
  kIo,               // OS-level read/write/mmap failure
  kInternal,         // a bug: an invariant did not hold
};

const char* error_code_name(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;  // one line, names the file/object and the cause

  std::string to_string() const { return message; }
};

// Builds an Error with a fmt-style message.
template <typename... Args>
Error make_error(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Error{code, fmt::format(f, std::forward<Args>(args)...)};
}

// Minimal std::expected stand-in (GCC 12 has no <expected>).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}           // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}       // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok() && "Result::value() on an error; check ok() first");
    return std::get<T>(v_);
  }
  const T& value() const& {
    assert(ok() && "Result::value() on an error; check ok() first");
    return std::get<T>(v_);
  }
  T&& value() && {
    assert(ok() && "Result::value() on an error; check ok() first");
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const {
    assert(!ok() && "Result::error() on a value");
    return std::get<Error>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

// Result<void> equivalent.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status Ok() { return Status(); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    assert(!ok_ && "Status::error() on success");
    return error_;
  }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace lragent

// Propagate an error from a Status or Result expression.
#define LRA_CONCAT_INNER(a, b) a##b
#define LRA_CONCAT(a, b) LRA_CONCAT_INNER(a, b)

#define LRA_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    auto&& lra_status_ = (expr);                   \
    if (!lra_status_.ok()) return lra_status_.error(); \
  } while (0)

// LRA_ASSIGN_OR_RETURN(auto x, f()); declares x from a Result or returns its error.
#define LRA_ASSIGN_OR_RETURN(decl, expr) \
  LRA_ASSIGN_OR_RETURN_IMPL(LRA_CONCAT(lra_result_, __LINE__), decl, expr)
#define LRA_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.error();               \
  decl = std::move(tmp).value()
