// JsonConstraint (parsing response_format / schemas) and JsonMatcher over the
// machine of grammar.h.
#include "common/grammar/json_constraint.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/grammar.h"
#include "common/io/cat.h"
#include "common/json/json.h"
#include "common/status/status.h"

namespace coli::grammar {
using ::coli::internal_cat::Cat;
namespace {

using internal::Grammar;
using internal::Machine;
using internal::MachineState;
using Ordered = nlohmann::ordered_json;

// The one implementation of JsonConstraint: a grammar (shared by the constraints SplitObject
// makes of its parts) and a machine starting at one of its nodes.
class CompiledConstraint final : public JsonConstraint {
 public:
  explicit CompiledConstraint(Grammar g)
      : grammar_(std::make_shared<const Grammar>(std::move(g))), machine_(grammar_.get()) {}
  CompiledConstraint(std::shared_ptr<const Grammar> g, int32_t root)
      : grammar_(std::move(g)), machine_(grammar_.get(), root) {}
  const Machine& machine() const { return machine_; }
  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }

 private:
  std::shared_ptr<const Grammar> grammar_;
  Machine machine_;
};

// Parses with coli::json::Parse for its errors (line/column, duplicate keys,
// depth), then keeps the key order (property order is part of the constraint)
// with ordered_json.
absl::StatusOr<Ordered> ParseOrdered(std::string_view text, std::string_view source) {
  COLI_RETURN_IF_ERROR(json::Parse(text, source).status());
  Ordered doc = Ordered::parse(text.begin(), text.end(), nullptr,
                               /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError(Cat(std::string(source), ": not JSON"));
  return doc;
}

absl::StatusOr<std::shared_ptr<const JsonConstraint>> Make(const Ordered& schema,
                                                           std::string path) {
  COLI_ASSIGN_OR_RETURN(Grammar g, internal::CompileSchema(schema, std::move(path)));
  return std::shared_ptr<const JsonConstraint>(std::make_shared<CompiledConstraint>(std::move(g)));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const JsonConstraint>> JsonConstraint::FromResponseFormat(
    std::string_view response_format_json) {
  COLI_ASSIGN_OR_RETURN(Ordered f, ParseOrdered(response_format_json, "response_format"));
  if (!f.is_object()) return absl::InvalidArgumentError("response_format: expected an object");
  auto type = f.find("type");
  if (type == f.end() || !type->is_string()) {
    return absl::InvalidArgumentError("response_format.type: expected a string");
  }
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "text") return std::shared_ptr<const JsonConstraint>();
  if (t == "json_object") {
    // llama.cpp's server also takes {"type":"json_object","schema":{...}}.
    auto schema = f.find("schema");
    if (schema != f.end()) return Make(*schema, "response_format.schema");
    return std::shared_ptr<const JsonConstraint>(
        std::make_shared<CompiledConstraint>(internal::BuiltinGrammar()));
  }
  if (t == "json_schema") {
    auto js = f.find("json_schema");
    if (js == f.end() || !js->is_object()) {
      return absl::InvalidArgumentError("response_format.json_schema: expected an object");
    }
    auto schema = js->find("schema");
    if (schema == js->end()) {
      return absl::InvalidArgumentError("response_format.json_schema.schema: missing");
    }
    return Make(*schema, "response_format.json_schema.schema");
  }
  return absl::InvalidArgumentError(
      Cat("response_format.type: unknown type \"", t, "\" (text, json_object or json_schema)"));
}

absl::StatusOr<std::shared_ptr<const JsonConstraint>> JsonConstraint::FromSchema(
    std::string_view schema_json) {
  COLI_ASSIGN_OR_RETURN(Ordered s, ParseOrdered(schema_json, "schema"));
  return Make(s, "schema");
}

std::optional<ObjectProperties> SplitObject(const std::shared_ptr<const JsonConstraint>& whole) {
  const auto* compiled = dynamic_cast<const CompiledConstraint*>(whole.get());
  if (compiled == nullptr) return std::nullopt;
  const std::shared_ptr<const Grammar>& g = compiled->grammar();
  // A `$ref` compiles to a one-alternative anyOf in front of its target: look through those.
  int32_t at = g->root;
  for (size_t hops = 0; hops < g->nodes.size(); ++hops) {
    const internal::Node& n = g->nodes[static_cast<size_t>(at)];
    if (n.kind != internal::Kind::kAnyOf || n.alts.size() != 1) break;
    at = n.alts[0];
  }
  const internal::Node& root = g->nodes[static_cast<size_t>(at)];
  if (root.kind != internal::Kind::kObject) return std::nullopt;
  ObjectProperties out;
  for (const internal::Property& p : root.props) {
    out.properties.push_back({p.name, p.required, std::make_shared<CompiledConstraint>(g, p.node)});
  }
  if (root.additional >= 0) {
    out.additional = std::make_shared<CompiledConstraint>(g, root.additional);
  }
  return out;
}

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonConstraint> constraint)
    : state_(std::make_unique<State>()) {
  const auto* compiled = dynamic_cast<const CompiledConstraint*>(constraint.get());
  state_->owner = std::move(constraint);
  if (compiled != nullptr) {
    state_->machine = &compiled->machine();
    state_->m = compiled->machine().Initial();
  }
}
JsonMatcher::JsonMatcher(const JsonMatcher& o) : state_(std::make_unique<State>(*o.state_)) {}
JsonMatcher& JsonMatcher::operator=(const JsonMatcher& o) {
  if (this != &o) state_ = std::make_unique<State>(*o.state_);
  return *this;
}
JsonMatcher::JsonMatcher(JsonMatcher&&) noexcept = default;
JsonMatcher& JsonMatcher::operator=(JsonMatcher&&) noexcept = default;
JsonMatcher::~JsonMatcher() = default;

bool JsonMatcher::Accept(std::string_view bytes) {
  if (state_->machine == nullptr) {
    state_->consumed += static_cast<int64_t>(bytes.size());
    return true;
  }
  if (bytes.empty()) return true;
  MachineState next = state_->m;
  for (char c : bytes) {
    if (!state_->machine->Step(next, static_cast<uint8_t>(c))) return false;
  }
  state_->m = std::move(next);
  state_->consumed += static_cast<int64_t>(bytes.size());
  return true;
}

bool JsonMatcher::CanEnd() const {
  return state_->machine == nullptr || state_->machine->CanEnd(state_->m);
}

bool JsonMatcher::MustEnd() const {
  return state_->machine != nullptr && state_->machine->MustEnd(state_->m);
}

int64_t JsonMatcher::consumed() const { return state_->consumed; }

}  // namespace coli::grammar
