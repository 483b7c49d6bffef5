#include "app/cli/cli_command.h"

#include <cmath>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace kvchat::cli {

namespace {
std::map<std::string, CliCommand>& registry() {
  static std::map<std::string, CliCommand> commands;  // function-local: safe during static init
  return commands;
}
}  // namespace

void CliRegistry::add(CliCommand command) { registry()[command.name] = std::move(command); }

const CliCommand* CliRegistry::find(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<const CliCommand*> CliRegistry::all() {
  std::vector<const CliCommand*> out;
  for (auto& [name, command] : registry()) out.push_back(&command);
  return out;
}

ArgParser::ArgParser(std::set<std::string> value_options, std::set<std::string> flag_options)
    : value_options_(std::move(value_options)), flag_options_(std::move(flag_options)) {}

void ArgParser::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2);
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (flag_options_.count(name)) {
      if (inline_value) throw UsageError("option --" + name + " takes no value");
      flags_.insert(name);
    } else if (value_options_.count(name)) {
      if (inline_value) {
        values_[name] = *inline_value;
      } else {
        if (i + 1 >= args.size()) throw UsageError("option --" + name + " needs a value");
        values_[name] = args[++i];
      }
    } else {
      throw UsageError("unknown option --" + name);
    }
  }
}

bool ArgParser::has(const std::string& name) const { return flags_.count(name) || values_.count(name); }

std::optional<std::string> ArgParser::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string ArgParser::value_or(const std::string& name, const std::string& fallback) const {
  return value(name).value_or(fallback);
}

std::string ArgParser::required(const std::string& name) const {
  auto v = value(name);
  if (!v) throw UsageError("missing required option --" + name);
  return *v;
}

long long ArgParser::int64_or(const std::string& name, long long fallback) const {
  auto v = value(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  long long parsed = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0)
    throw UsageError("option --" + name + " expects an integer, got '" + *v + "'");
  return parsed;
}

int ArgParser::int_or(const std::string& name, int fallback) const {
  long long parsed = int64_or(name, fallback);
  if (parsed < -2147483648LL || parsed > 2147483647LL) throw UsageError("option --" + name + " is out of range");
  return static_cast<int>(parsed);
}

double ArgParser::double_or(const std::string& name, double fallback) const {
  auto v = value(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  double parsed = std::strtod(v->c_str(), &end);
  // nan and inf parse as numbers but mean nothing as a setting (a NaN temperature samples garbage).
  if (v->empty() || *end != '\0' || errno != 0 || !std::isfinite(parsed))
    throw UsageError("option --" + name + " expects a finite number, got '" + *v + "'");
  return parsed;
}

std::vector<std::string> split_list(const std::string& text, char separator) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(separator, start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::vector<long long> parse_int_list(const std::string& option, const std::string& text) {
  std::vector<long long> out;
  for (const std::string& item : split_list(text)) {
    errno = 0;
    char* end = nullptr;
    long long parsed = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0)
      throw UsageError("option --" + option + " expects comma-separated integers, got '" + item + "'");
    out.push_back(parsed);
  }
  return out;
}

}  // namespace kvchat::cli
