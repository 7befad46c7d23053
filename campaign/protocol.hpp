// The worker protocol (isolate.hpp): one UTF-8 JSON line per message. Requests go to the
// worker's stdin and name their kind ("request": "check" | "supports" | ...), replies come
// on its stdout, each line prefixed with kWorkerLinePrefix, and name theirs ("reply":
// "ready" first, then "result" | "supports" | ... | "error" for a refused request). Each
// side dispatches on the kind. Parent and worker are the same binary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "check/check.hpp"
#include "campaign/isolate.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

enum class RequestKind { Check, Supports, Describe, DrawCase, Submit };
enum class ReplyKind { Ready, Result, Supports, Kernels, Case, Started, Error };

/// A reply line: kWorkerLinePrefix, compact JSON, newline. Strings from kernels and plugins
/// need not be UTF-8; invalid bytes become U+FFFD rather than a failed reply.
std::string protocol_line(const nlohmann::json& reply);
/// A request line: compact JSON (invalid UTF-8 replaced as above), newline.
std::string request_line(const nlohmann::json& request);
/// JSON text with invalid UTF-8 replaced, as the journal keeps the worker's replies.
std::string json_text(const nlohmann::json& j);

// --- Requests, as the parent writes them ---------------------------------------------------

/// Check case c with the kernel (reply {"result": CASE_RESULT, "restart": BOOL}; with
/// "restart" the worker exits after the reply: its CUDA context is lost).
nlohmann::json check_request(const std::string& kernel, const Case& c, const EvaluationOptions& options);
/// Ask the kernel whether it supports c (reply {"supports": {"ok", "why"}}).
nlohmann::json supports_request(const std::string& kernel, const Case& c);
/// The named kernels' descriptions, every kernel's when names is empty (reply {"kernels"}).
nlohmann::json describe_request(const std::vector<std::string>& names);
/// Draw a generated case with the kernel (reply {"case"}).
nlohmann::json draw_case_request(const std::string& kernel, const DrawSpec& draw);
/// Check a case (or draw it first) in the worker's threads; no reply now. Replies, as they
/// happen: {"started": ID} when a thread takes it, then {"result", "id", "restart"[, "case":
/// DRAWN]} or {"error", "id"}. Other requests are refused while submitted cases are in flight.
nlohmann::json submit_request(std::uint64_t id, const std::string& kernel, const Case& c, const std::optional<DrawSpec>& draw,
                              const EvaluationOptions& options);

// --- Requests, as the worker reads them ----------------------------------------------------

struct Request {
  RequestKind kind = RequestKind::Check;
  nlohmann::json body;
};
/// A request line parsed, its kind read. InputError for a line that is not JSON or names no
/// known kind.
Request parse_request(const std::string& line);

/// A check's (or a submitted case's) kernel, resolved, its case or what to draw, and options.
struct ParsedCheck {
  Kernel* kernel = nullptr;
  Case c;
  std::optional<DrawSpec> draw;  ///< c is to be drawn first
  EvaluationOptions options;
};
/// InputError for an unknown kernel or baseline model, a malformed case or options.
ParsedCheck parse_check(Registry& registry, const nlohmann::json& request);
/// The kernel a `kind` request with {"kernel": NAME, field: VALUE} names, resolved in
/// registry; InputError (naming the expected shape) for another shape or an unknown kernel.
Kernel& requested_kernel(Registry& registry, const nlohmann::json& request, const char* kind, const char* field,
                         const char* value);
/// A submit request's id; InputError when it has none.
std::uint64_t submitted_id(const nlohmann::json& request);

// --- Replies, as the worker writes them: each names its kind ("reply": KIND) ------------------

/// The first line: {"pid", "kernels": how many}.
nlohmann::json ready_reply(long pid, std::size_t kernels);
/// A check's result, and whether the worker exits after it (its CUDA context is lost).
nlohmann::json result_reply(const CaseResult& result, bool restart);
/// supports(): {"ok", "why"}, why empty when supported.
nlohmann::json supports_reply(const std::optional<std::string>& why);
/// describe: the kernels' descriptions (kernel_description).
nlohmann::json kernels_reply(nlohmann::json descriptions);
/// draw_case: the drawn case.
nlohmann::json case_reply(const Case& c);
/// A submitted case a pool thread took.
nlohmann::json started_reply(std::uint64_t id);
/// A refused request (what in-process evaluation would throw as InputError).
nlohmann::json error_reply(const std::string& message);
/// A result or error reply to a submitted case: reply with its "id" added.
nlohmann::json for_submitted(nlohmann::json reply, std::uint64_t id);

// --- Replies, as the parent reads them --------------------------------------------------------

/// The kind a reply names; nullopt when it is not an object or names no known kind.
std::optional<ReplyKind> reply_kind(const nlohmann::json& reply);
/// A reply of kind `kind`: its JSON object; InputError naming `doing` for another kind or
/// a reply that is not one.
const nlohmann::json& expect_reply(const nlohmann::json& reply, ReplyKind kind, const char* doing);

/// A reply from the worker's pool: its JSON and, where present, "result" and "case" already
/// converted (off the campaign thread).
struct PoolReply {
  nlohmann::json reply;
  std::optional<ReplyKind> kind;       ///< reply_kind(reply)
  std::optional<CaseResult> result;    ///< reply["result"], converted
  std::optional<Case> drawn;           ///< reply["case"], converted
  bool malformed = false;              ///< one of them present but not convertible
  std::string result_text, case_text;  ///< the same, as JSON text (for the journal)
};
/// nullopt for a line that is not JSON.
std::optional<PoolReply> parse_pool_reply(const std::string& line);

// --- Their parts -----------------------------------------------------------------------------

nlohmann::json options_to_json(const EvaluationOptions& o);
EvaluationOptions options_from_json(const nlohmann::json& j);
nlohmann::json draw_to_json(const DrawSpec& d);
DrawSpec draw_from_json(const nlohmann::json& j);
/// One entry of the describe reply: the kernel's name, description and traits.
nlohmann::json kernel_description(const Kernel& k);
/// The traits of a describe entry (absent fields: KernelTraits' defaults for planning).
KernelTraits traits_from_description(const nlohmann::json& k);

}  // namespace ulpgate
