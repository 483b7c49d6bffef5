#include "engine/text/jinja/jinja_interpreter.h"

#include <chrono>
#include <ctime>
#include <memory>
#include <unordered_map>

#include "engine/text/jinja/jinja_budget.h"
#include "engine/text/jinja/jinja_builtins.h"
#include "engine/text/jinja/jinja_error.h"
#include "engine/text/jinja/jinja_limits.h"
#include "engine/text/jinja/jinja_macros.h"

namespace kvchat::jinja {

namespace {

// Frames are shared: a macro keeps the scope it was defined in (it reads the names there when it is
// called, as a Python closure does), and may outlive it (stored in a namespace, called later).
struct Frame;
using FramePtr = std::shared_ptr<Frame>;
struct Frame {
  std::unordered_map<std::string, Value> variables;
  FramePtr parent;
};

enum class Flow { Normal, Break, Continue };

std::string where(const Position& pos) { return std::to_string(pos.line) + ":" + std::to_string(pos.column); }

// Dates for strftime_now: "YYYY-MM-DD" at midnight (as the reference renders were made), or now.
std::tm date_for_strftime(const std::string& today) {
  std::tm tm{};
  if (today.empty()) {
    std::time_t now = std::time(nullptr);
    localtime_r(&now, &tm);
    return tm;
  }
  int year = 0, month = 0, day = 0;
  char tail = 0;
  if (std::sscanf(today.c_str(), "%4d-%2d-%2d%c", &year, &month, &day, &tail) != 3 || month < 1 || month > 12 ||
      day < 1 || day > 31)
    throw EvalError("strftime_now: the fixed date '" + today + "' is not YYYY-MM-DD");
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  std::time_t t = timegm(&tm);  // fills in the weekday and the day of the year
  gmtime_r(&t, &tm);
  return tm;
}

class Interpreter {
 public:
  Interpreter(const Value& context, std::string today) : today_(std::move(today)) {
    for (const auto& [key, value] : context.entries()) root_->variables[key.text] = value;
    install_globals();
  }

  // A macro stored in a scope it closes over is a reference cycle: cut the scopes that macros kept.
  //
  // A namespace is mutable, so it can hold itself, or a chain of namespaces each holding the next:
  // freed the usual way, one would leak and the other recurse once per link. Every namespace of the
  // render is held here until the end, then emptied while all are still held, so none frees another.
  ~Interpreter() {
    for (const auto& ns : namespaces_) ns->attributes.clear();
    for (const FramePtr& captured : captured_)
      for (Frame* frame = captured.get(); frame; frame = frame->parent.get()) frame->variables.clear();
    for (const FramePtr& captured : captured_) captured->parent.reset();
  }

  void run(const Body& body, std::string& out) {
    current_ = root_;
    exec(body, out);
  }

 private:
  // ------------------------------------------------------------ globals
  void install_globals() {
    globals_["raise_exception"] = Value::from_callable("raise_exception", [](const CallArgs& args) -> Value {
      std::string message = args.positional.empty() ? "" : to_str(args.positional[0]);
      throw TemplateError(message);
    });
    globals_["namespace"] = Value::from_callable("namespace", [this](const CallArgs& args) {
      if (namespaces_.size() >= static_cast<std::size_t>(kMaxNamespaces))
        throw EvalError("more than " + std::to_string(kMaxNamespaces) + " namespace() objects");
      Value ns;
      ns.kind = Kind::Namespace;
      ns.ns = std::make_shared<NamespaceData>();
      namespaces_.push_back(ns.ns);
      auto set = [&](const Value& key, const Value& value) {
        for (auto& entry : ns.ns->attributes)
          if (equals(entry.first, key)) {
            entry.second = value;
            return;
          }
        ns.ns->attributes.emplace_back(key, value);
      };
      if (args.positional.size() > 1) throw EvalError("namespace() takes at most one positional argument");
      if (!args.positional.empty()) {
        if (args.positional[0].kind != Kind::Dict)
          throw EvalError("namespace(): the positional argument must be a dict");
        for (const auto& [key, value] : args.positional[0].entries()) set(key, value);
      }
      for (const auto& [key, value] : args.keyword) set(Value::from_string(key), value);
      return ns;
    });
    globals_["dict"] = Value::from_callable("dict", [](const CallArgs& args) {
      if (!args.positional.empty()) throw EvalError("dict() with positional arguments is not supported");
      DictEntries entries;
      for (const auto& [key, value] : args.keyword) entries.emplace_back(Value::from_string(key), value);
      return Value::from_dict(std::move(entries));
    });
    globals_["range"] = Value::from_callable("range", [](const CallArgs& args) {
      if (!args.keyword.empty()) throw EvalError("range() takes no keyword arguments");
      if (args.positional.empty() || args.positional.size() > 3)
        throw EvalError("range expected 1 to 3 arguments, got " + std::to_string(args.positional.size()));
      for (const Value& v : args.positional)
        if (!v.is_integral()) throw EvalError("range(): arguments must be integers");
      std::int64_t start = 0, stop, step = 1;
      if (args.positional.size() == 1) {
        stop = args.positional[0].as_int();
      } else {
        start = args.positional[0].as_int();
        stop = args.positional[1].as_int();
        if (args.positional.size() == 3) step = args.positional[2].as_int();
      }
      if (step == 0) throw EvalError("range() arg 3 must not be zero");
      std::uint64_t length = range_length(start, stop, step);
      if (length > 100000) throw EvalError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      ValueList items;
      items.reserve(static_cast<std::size_t>(length));
      // start + k * step stays between start and stop for k < length: no overflow.
      for (std::uint64_t k = 0; k < length; ++k)
        items.push_back(Value::from_int(
            static_cast<std::int64_t>(static_cast<std::uint64_t>(start) + k * static_cast<std::uint64_t>(step))));
      return Value::from_list(std::move(items), Sequence::View);
    });
    std::string today = today_;
    globals_["strftime_now"] = Value::from_callable("strftime_now", [today](const CallArgs& args) {
      if (args.positional.size() != 1 || !args.positional[0].is_string())
        throw EvalError("strftime_now() takes one format string");
      std::tm tm = date_for_strftime(today);
      const std::string& format = args.positional[0].text;
      if (format.empty()) return Value::from_string("");
      check_size(saturating_add(256, saturating_multiply(format.size(), 16)), "strftime_now buffer");
      std::string buffer(256 + format.size() * 16, '\0');
      std::size_t n = std::strftime(buffer.data(), buffer.size(), format.c_str(), &tm);
      buffer.resize(n);
      return Value::from_string(buffer);
    });
    for (const char* name : {"cycler", "joiner", "lipsum"}) {
      std::string global = name;
      globals_[global] = Value::from_callable(global, [global](const CallArgs&) -> Value {
        throw EvalError("the global function " + global + "() is not supported");
      });
    }
  }

  // ------------------------------------------------------------ variables
  Value lookup(const std::string& name) const {
    for (const Frame* frame = current_.get(); frame; frame = frame->parent.get()) {
      auto it = frame->variables.find(name);
      if (it != frame->variables.end()) return it->second;
    }
    auto global = globals_.find(name);
    if (global != globals_.end()) return global->second;
    return Value::undefined("'" + name + "' is undefined");
  }

  void assign(const AssignTarget& target, const Value& value) {
    if (!target.is_tuple) {
      current_->variables[target.names[0]] = value;
      return;
    }
    ValueList items = iterate(value);
    if (items.size() != target.names.size())
      throw EvalError(items.size() > target.names.size()
                          ? "too many values to unpack (expected " + std::to_string(target.names.size()) + ")"
                          : "not enough values to unpack (expected " + std::to_string(target.names.size()) + ", got " +
                                std::to_string(items.size()) + ")");
    for (std::size_t i = 0; i < items.size(); ++i) current_->variables[target.names[i]] = items[i];
  }

  // ------------------------------------------------------------ statements
  Flow exec(const Body& body, std::string& out) {
    for (const StmtPtr& stmt : body) {
      Flow flow = exec(*stmt, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  // Every rendered piece goes through here, the output of macros and blocks included.
  static void append_output(std::string& out, const std::string& text) {
    check_size(saturating_add(out.size(), text.size()), "rendered output");
    charge_bytes(text.size());
    out += text;
  }

  Flow exec(const Stmt& stmt, std::string& out) {
    Depth depth(*this, stmt.pos);
    guarded(stmt.pos, [] { charge_steps(1); });
    return exec_unguarded(stmt, out);
  }

  Flow exec_unguarded(const Stmt& stmt, std::string& out) {
    switch (stmt.kind) {
      case Stmt::Kind::Text: guarded(stmt.pos, [&] { append_output(out, stmt.text); }); return Flow::Normal;
      case Stmt::Kind::Output: {
        Value value = eval(*stmt.expr);
        guarded(stmt.expr->pos, [&] { append_output(out, to_str(value)); });
        return Flow::Normal;
      }
      case Stmt::Kind::If:
        for (const auto& [condition, body] : stmt.branches)
          if (truthy(eval(*condition))) return exec(body, out);
        return exec(stmt.else_body, out);
      case Stmt::Kind::For: return exec_for(stmt, out);
      case Stmt::Kind::Set: {
        Value value = eval(*stmt.expr);
        guarded(stmt.pos, [&] { set_target(stmt.target, value); });
        return Flow::Normal;
      }
      case Stmt::Kind::SetBlock: {
        Value value = render_block(stmt);
        guarded(stmt.pos, [&] { set_target(stmt.target, value); });
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        Value value = render_block(stmt);
        guarded(stmt.pos, [&] { append_output(out, to_str(value)); });
        return Flow::Normal;
      }
      case Stmt::Kind::Macro:
        current_->variables[stmt.target.names[0]] = make_macro(stmt, stmt.target.names[0]);
        return Flow::Normal;
      case Stmt::Kind::CallBlock: {
        // The call expression gets one more keyword argument: the block's body as `caller`.
        const Expr& call = *stmt.expr;
        Value callee = eval(*call.object);
        CallArgs args = eval_args(call, nullptr);
        args.keyword.emplace_back("caller", make_macro(stmt, "caller"));
        Value result = guarded(call.pos, [&] { return call_value(callee, args); });
        guarded(call.pos, [&] { append_output(out, to_str(result)); });
        return Flow::Normal;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  // The body of a set or filter block rendered in a scope of its own, then through the block's
  // filters if any (they apply to the placeholder name "").
  Value render_block(const Stmt& stmt) {
    std::string text;
    {
      Scope scope(*this, inner());
      exec(stmt.body, text);
    }
    Value value = Value::from_string(std::move(text));
    if (stmt.filter) {
      FramePtr frame = inner();
      frame->variables[""] = value;
      Scope scope(*this, frame);
      value = eval(*stmt.filter);
    }
    return value;
  }

  // ------------------------------------------------------------ macros
  // A macro (or a call block's body, named "caller") as a callable that closes over the current scope.
  Value make_macro(const Stmt& stmt, const std::string& name) {
    MacroSignature signature;
    signature.name = name;
    for (const auto& parameter : stmt.parameters) signature.parameters.push_back(parameter.first);
    signature.catch_varargs = stmt.catch_varargs;
    signature.catch_kwargs = stmt.catch_kwargs;
    signature.takes_caller = stmt.takes_caller;
    FramePtr closure = current_;
    if (captured_.empty() || captured_.back() != closure) captured_.push_back(closure);
    const Stmt* definition = &stmt;
    return Value::from_callable(name, [this, definition, closure, signature](const CallArgs& args) {
      return invoke_macro(*definition, signature, closure, args);
    });
  }

  // Jinja2's macro call: arguments bound, then the missing ones given their defaults (evaluated now, in
  // the macro's scope, so a default can use an earlier parameter), then the body rendered to a str.
  Value invoke_macro(const Stmt& stmt, const MacroSignature& signature, const FramePtr& closure, const CallArgs& args) {
    if (macro_depth_ >= kMaxMacroDepth)
      throw EvalError("maximum recursion depth exceeded: more than " + std::to_string(kMaxMacroDepth) +
                      " nested macro calls (calling '" + signature.name + "')");
    BoundArguments bound = bind_macro_arguments(signature, args);
    auto frame = std::make_shared<Frame>();
    frame->parent = closure;
    Scope scope(*this, frame);
    DepthGuard depth(macro_depth_);
    for (std::size_t i = 0; i < stmt.parameters.size(); ++i) {
      const auto& [name, fallback] = stmt.parameters[i];
      if (bound.values[i])
        frame->variables[name] = *bound.values[i];
      else if (fallback)
        frame->variables[name] = eval(*fallback);
      else
        frame->variables[name] = Value::undefined("parameter '" + name + "' was not provided");
    }
    if (bound.caller) frame->variables["caller"] = *bound.caller;
    if (bound.varargs) frame->variables["varargs"] = *bound.varargs;
    if (bound.kwargs) frame->variables["kwargs"] = *bound.kwargs;
    std::string out;
    exec(stmt.body, out);  // break/continue cannot leave a macro: the parser rejects them there
    return Value::from_string(std::move(out));
  }

  struct DepthGuard {
    explicit DepthGuard(int& depth) : depth(depth) { ++depth; }
    ~DepthGuard() { --depth; }
    int& depth;
  };

  // Statements and expressions under evaluation, macro calls included: past kMaxRenderDepth the
  // render fails instead of exhausting the stack (each template is bounded by the parser, but macros
  // can stack up deep templates). About 1.5 KB of stack each: 1024 fit in a 2 MiB stack.
  struct Depth {
    Depth(Interpreter& interpreter, const Position& pos) : depth(interpreter.render_depth_) {
      if (depth >= kMaxRenderDepth)
        throw TemplateError(where(pos) + ": evaluation nested too deeply (more than " +
                            std::to_string(kMaxRenderDepth) +
                            " statements and expressions at once, macro calls included)");
      ++depth;
    }
    ~Depth() { --depth; }
    int& depth;
  };

  void set_target(const AssignTarget& target, const Value& value) {
    if (target.namespace_attribute.empty()) {
      assign(target, value);
      return;
    }
    Value ns = lookup(target.names[0]);
    if (ns.kind != Kind::Namespace) throw EvalError("cannot assign attribute on non-namespace object");
    Value key = Value::from_string(target.namespace_attribute);
    for (auto& entry : ns.ns->attributes)
      if (equals(entry.first, key)) {
        entry.second = value;
        return;
      }
    ns.ns->attributes.emplace_back(key, value);
  }

  // Makes `frame` the current scope for the lifetime of the object.
  struct Scope {
    Scope(Interpreter& interpreter, FramePtr frame) : self(interpreter), saved(interpreter.current_) {
      self.current_ = std::move(frame);
    }
    ~Scope() { self.current_ = saved; }
    Interpreter& self;
    FramePtr saved;
  };

  // A new scope inside the current one.
  FramePtr inner() const {
    auto frame = std::make_shared<Frame>();
    frame->parent = current_;
    return frame;
  }

  Flow exec_for(const Stmt& stmt, std::string& out) {
    Value iterable = eval(*stmt.expr);
    // A list is iterated in place, and other items moved into the loop, never copied: copying a
    // 100,000-item range once or twice per outer iteration cost far more than the steps the budget
    // charges for it, so nested loops ran for seconds before the budget stopped them.
    std::shared_ptr<const ValueList> items;
    if (iterable.kind == Kind::List && !stmt.filter) {
      guarded(stmt.expr->pos, [&] { charge_steps(static_cast<std::int64_t>(iterable.list->size())); });
      items = iterable.list;
    } else {
      ValueList iterated = guarded(stmt.expr->pos, [&] { return iterate(iterable); });
      if (stmt.filter) {
        ValueList kept;
        for (const Value& item : iterated) {
          Scope scope(*this, inner());
          guarded(stmt.pos, [&] { assign(stmt.target, item); });
          if (truthy(eval(*stmt.filter))) kept.push_back(item);
        }
        iterated = std::move(kept);
      }
      items = std::make_shared<const ValueList>(std::move(iterated));
    }
    if (items->empty()) {
      Scope scope(*this, inner());
      exec(stmt.else_body, out);
      return Flow::Normal;
    }
    Value loop;
    loop.kind = Kind::Loop;
    loop.loop = std::make_shared<LoopData>();
    loop.loop->items = items;
    const ValueList& loop_items = *items;
    for (std::size_t i = 0; i < loop_items.size(); ++i) {
      guarded(stmt.pos, [] { charge_steps(1); });
      loop.loop->index0 = static_cast<std::int64_t>(i);
      FramePtr frame = inner();
      Scope scope(*this, frame);
      guarded(stmt.pos, [&] { assign(stmt.target, loop_items[i]); });
      frame->variables["loop"] = loop;
      if (exec(stmt.body, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  // ------------------------------------------------------------ expressions
  template <typename F>
  auto guarded(const Position& pos, F&& body) -> decltype(body()) {
    try {
      return body();
    } catch (const EvalError& error) {
      throw TemplateError(where(pos) + ": " + error.what());
    }
  }

  Value eval(const Expr& expr) {
    Depth depth(*this, expr.pos);
    return guarded(expr.pos, [&] {
      charge_steps(1);
      Value value = eval_unguarded(expr);
      if (produces_new_value(expr))
        charge_new_value(value);
      else if (value.is_string())
        charge_bytes(value.text.size());  // a copy of an existing string
      return value;
    });
  }

  // Whether evaluating `expr` builds a value (its size is checked and charged) rather than looking one up.
  static bool produces_new_value(const Expr& expr) {
    switch (expr.kind) {
      case Expr::Kind::Literal:
      case Expr::Kind::Name:
      case Expr::Kind::Getattr: return false;
      case Expr::Kind::Getitem: return expr.items[0]->kind == Expr::Kind::Slice;
      default: return true;
    }
  }

  CallArgs eval_args(const Expr& expr, const Value* first) {
    CallArgs args;
    if (first) args.positional.push_back(*first);
    for (const ExprPtr& item : expr.items) args.positional.push_back(eval(*item));
    for (const auto& [key, value] : expr.keywords) args.keyword.emplace_back(key, eval(*value));
    return args;
  }

  static Value call_value(const Value& callee, const CallArgs& args) {
    if (callee.is_undefined()) fail_undefined(callee);
    if (callee.kind != Kind::Callable) throw EvalError("'" + type_description(callee) + "' is not callable");
    return callee.callable->call(args);
  }

  Value eval_unguarded(const Expr& expr) {
    switch (expr.kind) {
      case Expr::Kind::Literal: return expr.literal;
      case Expr::Kind::Name: return lookup(expr.name);
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        ValueList items;
        for (const ExprPtr& item : expr.items) items.push_back(eval(*item));
        return Value::from_list(std::move(items), expr.kind == Expr::Kind::Tuple ? Sequence::Tuple : Sequence::List);
      }
      case Expr::Kind::Dict: {
        DictEntries entries;
        for (std::size_t i = 0; i + 1 < expr.items.size(); i += 2) {
          Value key = eval(*expr.items[i]);
          Value value = eval(*expr.items[i + 1]);
          if ((key.kind == Kind::List && key.sequence == Sequence::List) || key.kind == Kind::Dict ||
              key.is_undefined())
            throw EvalError("unhashable type used as a dict key");
          bool replaced = false;
          for (auto& entry : entries)
            if (equals(entry.first, key)) {
              entry.second = value;
              replaced = true;
            }
          if (!replaced) entries.emplace_back(std::move(key), std::move(value));
        }
        return Value::from_dict(std::move(entries));
      }
      case Expr::Kind::Getattr: return get_attribute(eval(*expr.object), expr.name);
      case Expr::Kind::Getitem: {
        Value object = eval(*expr.object);
        const Expr& key = *expr.items[0];
        if (key.kind == Expr::Kind::Slice) {
          Value parts[3];
          for (int i = 0; i < 3; ++i) parts[i] = key.items[i] ? eval(*key.items[i]) : Value::none();
          return get_slice(object, parts[0], parts[1], parts[2]);
        }
        return get_item(object, eval(key));
      }
      case Expr::Kind::Slice: throw EvalError("a slice is only valid inside [...]");
      case Expr::Kind::Call: {
        Value callee = eval(*expr.object);
        return call_value(callee, eval_args(expr, nullptr));
      }
      case Expr::Kind::Filter: {
        Value value = eval(*expr.object);
        CallArgs args = eval_args(expr, &value);
        return apply_filter(expr.name, value, args);
      }
      case Expr::Kind::Test: {
        Value value = eval(*expr.object);
        CallArgs args = eval_args(expr, &value);
        bool result = apply_test(expr.name, value, args);
        return Value::from_bool(expr.negated ? !result : result);
      }
      case Expr::Kind::Unary: {
        Value operand = eval(*expr.object);
        if (expr.name == "not") return Value::from_bool(!truthy(operand));
        return unary_minus(operand, expr.name == "-");
      }
      case Expr::Kind::Binary: {
        Value left = eval(*expr.object);
        if (expr.name == "and") return truthy(left) ? eval(*expr.items[0]) : left;
        if (expr.name == "or") return truthy(left) ? left : eval(*expr.items[0]);
        Value right = eval(*expr.items[0]);
        if (expr.name == "~") return Value::from_string(to_str(left) + to_str(right));
        return binary_operator(expr.name, left, right);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*expr.object);
        for (std::size_t i = 0; i < expr.ops.size(); ++i) {
          Value right = eval(*expr.items[i]);
          if (!compare(expr.ops[i], left, right)) return Value::from_bool(false);
          left = std::move(right);
        }
        return Value::from_bool(true);
      }
      case Expr::Kind::CondExpr: {
        if (truthy(eval(*expr.items[1]))) return eval(*expr.items[0]);
        if (expr.items[2]) return eval(*expr.items[2]);
        return Value::undefined("the inline if-expression on line " + std::to_string(expr.pos.line) +
                                " evaluated to false and no else section was defined.");
      }
    }
    throw EvalError("unknown expression");
  }

  std::string today_;
  FramePtr root_ = std::make_shared<Frame>();
  FramePtr current_ = root_;
  std::unordered_map<std::string, Value> globals_;
  std::vector<FramePtr> captured_;                          // scopes macros closed over (see the destructor)
  std::vector<std::shared_ptr<NamespaceData>> namespaces_;  // every namespace() made (see the destructor)
  int macro_depth_ = 0;
  int render_depth_ = 0;
};

}  // namespace

std::string render(const Body& body, const Value& context, const std::string& today) {
  if (context.kind != Kind::Dict) throw TemplateError("the template context must be a JSON object");
  RenderBudget budget;
  Interpreter interpreter(context, today);
  std::string out;
  interpreter.run(body, out);
  return out;
}

}  // namespace kvchat::jinja
