#include "campaign/protocol.hpp"

#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

namespace ulpgate {

using json = nlohmann::json;

namespace {

// A message kind and its name on the wire; one table per direction, looked up both ways.
template <class Kind>
struct KindName {
  Kind kind;
  const char* name;
};
constexpr KindName<RequestKind> kRequests[] = {{RequestKind::Check, "check"},
                                               {RequestKind::Supports, "supports"},
                                               {RequestKind::Describe, "describe"},
                                               {RequestKind::DrawCase, "draw_case"},
                                               {RequestKind::Submit, "submit"}};
constexpr KindName<ReplyKind> kReplies[] = {{ReplyKind::Ready, "ready"},     {ReplyKind::Result, "result"},
                                            {ReplyKind::Supports, "supports"}, {ReplyKind::Kernels, "kernels"},
                                            {ReplyKind::Case, "case"},       {ReplyKind::Started, "started"},
                                            {ReplyKind::Error, "error"}};

template <class Kind, std::size_t N>
const char* name_in(const KindName<Kind> (&table)[N], Kind kind) {
  for (const auto& k : table)
    if (k.kind == kind) return k.name;
  return "";
}

template <class Kind, std::size_t N>
std::optional<Kind> kind_in(const KindName<Kind> (&table)[N], const std::string& name) {
  for (const auto& k : table)
    if (name == k.name) return k.kind;
  return std::nullopt;
}

const char* kind_name(RequestKind kind) { return name_in(kRequests, kind); }
const char* reply_name(ReplyKind kind) { return name_in(kReplies, kind); }

json reply_of(ReplyKind kind, json fields) {
  fields["reply"] = reply_name(kind);
  return fields;
}

json request_of(RequestKind kind) { return {{"request", kind_name(kind)}}; }

}  // namespace

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string protocol_line(const json& reply) { return std::string(kWorkerLinePrefix) + json_text(reply) + "\n"; }

std::string request_line(const json& request) { return json_text(request) + "\n"; }

// --- Requests, as the parent writes them ---------------------------------------------------

json check_request(const std::string& kernel, const Case& c, const EvaluationOptions& options) {
  json q = request_of(RequestKind::Check);
  q["kernel"] = kernel, q["case"] = to_json(c), q["options"] = options_to_json(options);
  return q;
}

json supports_request(const std::string& kernel, const Case& c) {
  json q = request_of(RequestKind::Supports);
  q["kernel"] = kernel, q["case"] = to_json(c);
  return q;
}

json describe_request(const std::vector<std::string>& names) {
  json q = request_of(RequestKind::Describe);
  q["kernels"] = names.empty() ? json(nullptr) : json(names);
  return q;
}

json draw_case_request(const std::string& kernel, const DrawSpec& draw) {
  json q = request_of(RequestKind::DrawCase);
  q["kernel"] = kernel, q["draw"] = draw_to_json(draw);
  return q;
}

json submit_request(std::uint64_t id, const std::string& kernel, const Case& c, const std::optional<DrawSpec>& draw,
                    const EvaluationOptions& options) {
  json q = request_of(RequestKind::Submit);
  q["id"] = id, q["kernel"] = kernel, q["options"] = options_to_json(options);
  if (draw) q["draw"] = draw_to_json(*draw);
  else q["case"] = to_json(c);
  return q;
}

// --- Requests, as the worker reads them ----------------------------------------------------

Request parse_request(const std::string& line) {
  Request r;
  try {
    r.body = json::parse(line);
  } catch (const json::parse_error& e) {
    throw InputError(fmt::format("worker request: not valid JSON: {}", e.what()));
  }
  const auto kind = r.body.is_object() ? r.body.find("request") : r.body.end();
  if (kind == r.body.end() || !kind->is_string())
    throw InputError("worker request: must be a JSON object naming its kind (\"request\": \"check\", ...)");
  if (const auto k = kind_in(kRequests, kind->get<std::string>())) {
    r.kind = *k;
    return r;
  }
  throw InputError(fmt::format("worker request: unknown kind '{}' (check, supports, describe, draw_case or submit)",
                               kind->get<std::string>()));
}

Kernel& requested_kernel(Registry& registry, const json& q, const char* kind, const char* field, const char* value) {
  if (!q.contains("kernel") || !q["kernel"].is_string() || !q.contains(field))
    throw InputError(fmt::format("worker request: {} must be {{\"kernel\": NAME, \"{}\": {}}}", kind, field, value));
  Kernel* k = registry.resolve(q["kernel"].get<std::string>());
  if (!k) throw InputError(fmt::format("unknown kernel '{}' (see ulpgate list)", q["kernel"].get<std::string>()));
  return *k;
}

ParsedCheck parse_check(Registry& registry, const json& request) {
  if (!request.is_object() || !request.contains("kernel") || !request["kernel"].is_string() ||
      (!request.contains("case") && !request.contains("draw")))
    throw InputError("worker request: must be {\"kernel\": NAME, \"case\": CASE | \"draw\": DRAW, \"options\": {...}}");
  const std::string kernel_name = request["kernel"].get<std::string>();
  ParsedCheck p;
  p.kernel = registry.resolve(kernel_name);
  if (!p.kernel) throw InputError(fmt::format("unknown kernel '{}' (see ulpgate list)", kernel_name));
  if (request.contains("draw")) p.draw = draw_from_json(request["draw"]);
  else p.c = case_from_json(request["case"]);
  p.options = options_from_json(request.value("options", json(nullptr)));
  // evaluate() looks the baseline model up with find(); a parameterised CPU model exists
  // only once resolved.
  if (p.options.baseline && !registry.resolve(p.options.baseline->model))
    throw InputError(fmt::format("baseline model '{}' is not a kernel here", p.options.baseline->model));
  // Likewise a chained check's forward kernel.
  const std::string& forward = p.draw ? p.draw->limits.forward_kernel : p.c.forward_kernel;
  if (!forward.empty() && !registry.resolve(forward))
    throw InputError(fmt::format("forward kernel '{}' is not a kernel here (see ulpgate list)", forward));
  return p;
}

std::uint64_t submitted_id(const json& request) {
  if (!request.contains("id") || !request["id"].is_number_unsigned())
    throw InputError("worker request: submit must be {\"id\": N, \"kernel\": NAME, \"case\": CASE, ...}");
  return request["id"].get<std::uint64_t>();
}

// --- Replies -----------------------------------------------------------------------------------

json ready_reply(long pid, std::size_t kernels) { return reply_of(ReplyKind::Ready, {{"pid", pid}, {"kernels", kernels}}); }

json result_reply(const CaseResult& result, bool restart) {
  return reply_of(ReplyKind::Result, {{"result", case_result_to_json(result)}, {"restart", restart}});
}

json supports_reply(const std::optional<std::string>& why) {
  return reply_of(ReplyKind::Supports, {{"ok", !why}, {"why", why.value_or("")}});
}

json kernels_reply(json descriptions) { return reply_of(ReplyKind::Kernels, {{"kernels", std::move(descriptions)}}); }

json case_reply(const Case& c) { return reply_of(ReplyKind::Case, {{"case", to_json(c)}}); }

json started_reply(std::uint64_t id) { return reply_of(ReplyKind::Started, {{"id", id}}); }

json error_reply(const std::string& message) { return reply_of(ReplyKind::Error, {{"error", message}}); }

json for_submitted(json reply, std::uint64_t id) {
  reply["id"] = id;
  return reply;
}

std::optional<ReplyKind> reply_kind(const json& reply) {
  if (!reply.is_object()) return std::nullopt;
  const auto k = reply.find("reply");
  if (k == reply.end() || !k->is_string()) return std::nullopt;
  return kind_in(kReplies, k->get<std::string>());
}

const json& expect_reply(const json& reply, ReplyKind kind, const char* doing) {
  if (reply_kind(reply) != kind)
    throw InputError(fmt::format("a \"{}\" reply was expected while {}", reply_name(kind), doing));
  return reply;
}

std::optional<PoolReply> parse_pool_reply(const std::string& line) {
  PoolReply r;
  try {
    r.reply = json::parse(line);
  } catch (const json::parse_error&) {
    return std::nullopt;
  }
  r.kind = reply_kind(r.reply);
  if (r.kind != ReplyKind::Result) return r;
  try {
    if (const auto x = r.reply.find("result"); x != r.reply.end())
      r.result = case_result_from_json(*x, "result"), r.result_text = json_text(*x);
    if (const auto c = r.reply.find("case"); c != r.reply.end()) r.drawn = case_from_json(*c), r.case_text = json_text(*c);
  } catch (const std::exception&) {
    r.malformed = true;
  }
  return r;
}

// --- Their parts -----------------------------------------------------------------------------

json options_to_json(const EvaluationOptions& o) {
  return {{"tolerance", o.tolerance ? tolerance_to_json(*o.tolerance) : json(nullptr)},
          {"baseline", o.baseline ? baseline_to_json(*o.baseline) : json(nullptr)},
          {"relations", o.relations},
          {"effective_bits", o.effective_bits}};
}

EvaluationOptions options_from_json(const json& j) {
  EvaluationOptions o;
  if (j.is_null()) return o;
  if (!j.is_object()) throw InputError("request.options: must be a JSON object");
  for (const auto& [key, value] : j.items())
    if (key != "tolerance" && key != "baseline" && key != "relations" && key != "effective_bits")
      throw InputError("request.options." + key + ": unknown field");
  for (const char* flag : {"relations", "effective_bits"})
    if (auto f = j.find(flag); f != j.end() && !f->is_boolean())
      throw InputError(fmt::format("request.options.{}: must be true or false", flag));
  o.relations = j.value("relations", true);
  o.effective_bits = j.value("effective_bits", false);
  if (auto t = j.find("tolerance"); t != j.end() && !t->is_null())
    o.tolerance = tolerance_from_json(*t, "request.options.tolerance");
  if (auto b = j.find("baseline"); b != j.end() && !b->is_null())
    o.baseline = baseline_from_json(*b, "request.options.baseline");
  return o;
}

json draw_to_json(const DrawSpec& d) {
  return {{"op", name(d.op)}, {"dtype", d.dtype}, {"target_seed", d.target_seed},
          {"index", d.index}, {"max_reduction", d.limits.max_reduction}, {"gelu", d.limits.gelu},
          {"large", d.limits.large}, {"large_kind", d.limits.large_kind}, {"mapping", d.limits.mapping},
          {"forward_kernel", d.limits.forward_kernel}};
}

DrawSpec draw_from_json(const json& j) {
  const auto bad = [] { return InputError("worker request: draw must be {\"op\", \"dtype\", \"target_seed\", \"index\", "
                                          "\"max_reduction\", \"gelu\", \"large\", \"large_kind\", \"mapping\", \"forward_kernel\"}"); };
  if (!j.is_object()) throw bad();
  DrawSpec d;
  try {
    const std::optional<Op> op = parse_op(j.at("op").get<std::string>());
    if (!op) throw bad();
    d.op = *op;
    d.dtype = j.at("dtype").get<std::string>();
    d.target_seed = j.at("target_seed").get<std::uint64_t>();
    d.index = j.at("index").get<std::uint64_t>();
    d.limits.max_reduction = j.at("max_reduction").get<std::int64_t>();
    d.limits.gelu = j.at("gelu").get<bool>();
    d.limits.large = j.at("large").get<bool>();
    d.limits.large_kind = j.at("large_kind").get<int>();
    d.limits.mapping = j.at("mapping").get<bool>();
    d.limits.forward_kernel = j.at("forward_kernel").get<std::string>();
  } catch (const json::exception&) {
    throw bad();
  }
  return d;
}

json kernel_description(const Kernel& k) {
  const KernelTraits t = k.traits();
  return {{"name", k.name()}, {"description", k.description()},
          {"memory", t.memory == Memory::Device ? "device" : "host"}, {"deterministic", t.deterministic},
          {"accumulator_bits", t.accumulator_bits}, {"p_bits", t.p_bits}, {"promote", t.promote},
          {"arithmetic_source", t.arithmetic_source}, {"accumulation_model", t.accumulation_model},
          {"rounds_to_nearest", t.rounds_to_nearest}, {"flushes_subnormals", t.flushes_subnormals},
          {"activation_error", t.activation_error}, {"writes_lse", t.writes_lse},
          {"attention_variants", t.attention_variants}, {"atomic_dq", t.atomic_dq},
          {"input_rounding", std::string(name(t.input_rounding))}};
}

KernelTraits traits_from_description(const json& k) {
  KernelTraits t;
  t.memory = k.value("memory", "host") == "device" ? Memory::Device : Memory::Host;
  t.deterministic = k.value("deterministic", true);
  t.accumulator_bits = k.value("accumulator_bits", 0);
  t.p_bits = k.value("p_bits", 0);
  t.promote = k.value("promote", 0);
  t.arithmetic_source = k.value("arithmetic_source", "");
  t.accumulation_model = k.value("accumulation_model", "");
  t.rounds_to_nearest = k.value("rounds_to_nearest", false);
  t.flushes_subnormals = k.value("flushes_subnormals", false);
  t.activation_error = k.value("activation_error", 0.0);
  t.writes_lse = k.value("writes_lse", false);  // the generator draws LSE cases only for such kernels
  t.attention_variants = k.value("attention_variants", 0u);  // and variants only for kernels that apply them
  t.atomic_dq = k.value("atomic_dq", false);
  if (const auto r = parse_rounding(k.value("input_rounding", ""))) t.input_rounding = *r;
  return t;
}

}  // namespace ulpgate
