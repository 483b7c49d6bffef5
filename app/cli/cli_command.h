#pragma once
// kvchat-cli subcommands. Each app/cli/cmd_*.cpp defines one and registers it with a static
// CliRegistration; main.cpp dispatches on the first argument. Adding a subcommand touches no other file.
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvchat::cli {

// A usage error: main prints "kvchat-cli <command>: <message>" on stderr and exits with 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CliCommand {
  std::string name;
  std::string summary;                                           // one line for `kvchat-cli --help`
  std::string usage;                                             // full usage text for `kvchat-cli <name> --help`
  std::function<int(const std::vector<std::string>& args)> run;  // args exclude the command name
};

class CliRegistry {
 public:
  static void add(CliCommand command);
  static const CliCommand* find(const std::string& name);
  static std::vector<const CliCommand*> all();
};

struct CliRegistration {
  explicit CliRegistration(CliCommand command) { CliRegistry::add(std::move(command)); }
};

// Minimal `--name value` / `--flag` parser. Every option must be declared; unknown options,
// missing values and stray positionals are UsageErrors.
class ArgParser {
 public:
  ArgParser(std::set<std::string> value_options, std::set<std::string> flag_options);
  void parse(const std::vector<std::string>& args);

  bool has(const std::string& name) const;
  std::optional<std::string> value(const std::string& name) const;
  std::string value_or(const std::string& name, const std::string& fallback) const;
  std::string required(const std::string& name) const;
  int int_or(const std::string& name, int fallback) const;
  long long int64_or(const std::string& name, long long fallback) const;
  double double_or(const std::string& name, double fallback) const;

 private:
  std::set<std::string> value_options_;
  std::set<std::string> flag_options_;
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
};

// Parses "1,2,3" into integers; UsageError names the option on bad input.
std::vector<long long> parse_int_list(const std::string& option, const std::string& text);
std::vector<std::string> split_list(const std::string& text, char separator = ',');

}  // namespace kvchat::cli
