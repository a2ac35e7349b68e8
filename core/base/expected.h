// Expected<T> and Error: errors as values inside Kestrel (style.md practice 3).
//
// Every fallible function returns Expected<T>; callers propagate with KESTREL_TRY / KESTREL_TRY_ASSIGN.
// Error carries a code (mapped to a gRPC status at the edge, never earlier) and a message a person can act on.
// Expected is a small value type: copyable when T is, movable, no exceptions thrown by its own operations.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace kestrel {

enum class ErrorCode {
  kInvalidArgument,     // the caller passed something malformed (bad flag, bad token id, bad shape)
  kNotFound,            // a named thing does not exist (file, tensor, metadata key, session)
  kOutOfRange,          // a value is outside what the model or file allows (context overflow, offset past end)
  kDataLoss,            // a file or buffer is corrupt or truncated
  kUnsupported,         // well-formed but not something Kestrel implements (unknown quant type, architecture)
  kIo,                  // the operating system refused (open, mmap, write)
  kResourceExhausted,   // a budget or limit is full (memory, sessions, queue)
  kFailedPrecondition,  // the system is not in a state where this can run
  kCancelled,           // the caller (or an Abort) cancelled the request
  kDeadlineExceeded,    // the request's deadline passed before its work finished
  kUnavailable,         // the service is not serving right now (loading, draining); retrying later can succeed
  kInternal,            // a bug: an invariant did not hold
};

const char* error_code_name(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;

  // "data loss: tensor 'x' ends past the end of the file" -- for logs and CLI output.
  std::string to_string() const;
};

// Builds an Error; use as `return make_error(ErrorCode::kNotFound, "no tensor '" + name + "'");`
inline Error make_error(ErrorCode code, std::string message) { return Error{code, std::move(message)}; }

// Holds either a T or an Error. `if (!e) return e.error();` or KESTREL_TRY_ASSIGN.
template <class T>
class [[nodiscard]] Expected {
 public:
  // NOLINTNEXTLINE(google-explicit-constructor): value-or-error return type
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  // NOLINTNEXTLINE(google-explicit-constructor): same
  Expected(Error error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & {
    assert(has_value());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(has_value());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(has_value());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& {
    assert(!has_value());
    return std::get<1>(v_);
  }
  Error&& error() && {
    assert(!has_value());
    return std::get<1>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

// Expected<void>: success or an Error.
template <>
class [[nodiscard]] Expected<void> {
 public:
  Expected() = default;
  // NOLINTNEXTLINE(google-explicit-constructor): value-or-error return type
  Expected(Error error) : error_(std::move(error)), ok_(false) {}

  bool has_value() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const& {
    assert(!ok_);
    return error_;
  }
  Error&& error() && {
    assert(!ok_);
    return std::move(error_);
  }

 private:
  Error error_;
  bool ok_ = true;
};

using Status = Expected<void>;

inline Status ok_status() { return {}; }

}  // namespace kestrel

#define KESTREL_CONCAT_INNER(a, b) a##b
#define KESTREL_CONCAT(a, b) KESTREL_CONCAT_INNER(a, b)

// Propagates the error of an Expected<...> expression; discards its value.
#define KESTREL_TRY(expr)                                                    \
  do {                                                                       \
    auto&& kestrel_try_result_ = (expr);                                     \
    if (!kestrel_try_result_) return std::move(kestrel_try_result_).error(); \
  } while (0)

// `KESTREL_TRY_ASSIGN(auto x, make_x());` declares x from the value or returns the error.
#define KESTREL_TRY_ASSIGN(decl, expr) KESTREL_TRY_ASSIGN_IMPL(KESTREL_CONCAT(kestrel_tmp_, __LINE__), decl, expr)
#define KESTREL_TRY_ASSIGN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                             \
  if (!tmp) return std::move(tmp).error();       \
  decl = std::move(tmp).value()
