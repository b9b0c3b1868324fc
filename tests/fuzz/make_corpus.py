#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/ (small, valid and
near-valid inputs). Run from the repository root; inputs that a fuzz run found
interesting are added by scripts/fuzz.sh --keep, crashes go to
tests/fuzz/regressions/<target>/."""
import json
import pathlib
import struct

ROOT = pathlib.Path("tests/fuzz/corpus")


def put(target, name, data):
    d = ROOT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


# api-keys files
put("api_keys", "plain.json", '{"keys": [{"key": "sk-a", "tenant": "alice"}]}')
put("api_keys", "admin.json", '{"keys": [{"key": "sk-a", "tenant": "alice"}, {"key": "sk-o", "tenant": "ops", "admin": true}]}')
put("api_keys", "limits.json", json.dumps({"keys": [{"key": "k1", "tenant": "t", "limits": {
    "max_requests_in_flight": 4, "tokens_per_minute": 9000, "max_kv_blocks": 64}}, {"key": "k2", "tenant": "t"}]}))
put("api_keys", "bad_admin.json", '{"keys": [{"key": "k", "tenant": "t", "admin": "yes"}]}')
put("api_keys", "empty.json", '{"keys": []}')

# OpenAI requests: first byte 0 completions, 1 chat, 2 cache drop
completion = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "n": 2,
              "logprobs": 3, "stop": ["x", "yy"], "seed": 7, "stream": True, "stream_options": {"include_usage": True}}
put("openai_request", "completion_ids.bin", b"\x00" + json.dumps(completion).encode())
put("openai_request", "completion_text.bin", b"\x00" + json.dumps({"model": "m", "prompt": "hello \u00e9",
                                                                    "max_tokens": 1}).encode())
chat = {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
    {"type": "text", "text": "hi"}]}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "1"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "auto", "chat_template_kwargs": {"enable_thinking": False}, "max_completion_tokens": 9}
put("openai_request", "chat_tools.bin", b"\x01" + json.dumps(chat).encode())
put("openai_request", "chat_bos.bin", b"\x01" + json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                             "chat_template_kwargs": {"bos_token": "<x>"}}).encode())
put("openai_request", "drop_all.bin", b"\x02" + b'{"all": true}')
put("openai_request", "drop_prompt.bin", b"\x02" + b'{"prompt": [5, 6, 7], "keep_prefix_tokens": 2}')
put("openai_request", "nested.bin", b"\x00" + b'{"model": "m", "prompt": ' + b"[" * 80 + b"]" * 80 + b"}")
put("openai_request", "surrogate.bin", b"\x01" + b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}')

# HTTP requests: first byte = read size, then one or more pipelined requests
body = b'{"model": "m", "prompt": [1]}'
put("http_request", "get.bin", b"\x07GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
put("http_request", "post.bin", b"\x20POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
put("http_request", "chunked.bin", b"\x03POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: t\r\n\r\n")
put("http_request", "pipelined.bin", b"\x40GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b?c=d HTTP/1.0\r\n\r\n"
    b"POST /c HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
put("http_request", "bad_length.bin", b"\x10POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n")
put("http_request", "two_lengths.bin", b"\x10POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd")
put("http_request", "expect.bin", b"\x10POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi")
put("http_request", "range.bin", b"\x10GET /metrics HTTP/1.1\r\nRange: bytes=0-,0-,0-\r\n\r\n")


# safetensors files
def safetensors(header, data):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


floats = struct.pack("<4f", 1, 2, 3, 4)
put("safetensors", "one_f32.safetensors", safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, floats))
put("safetensors", "two_bf16.safetensors", safetensors({
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
    "b": {"dtype": "F8_E4M3", "shape": [1, 4], "data_offsets": [4, 8]}}, bytes(range(8))))
put("safetensors", "overlap.safetensors", safetensors({
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)))
put("safetensors", "scalar_empty.safetensors", safetensors({
    "s": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]},
    "e": {"dtype": "F16", "shape": [0, 3], "data_offsets": [8, 8]}}, bytes(8)))

# checkpoint index (the directory holds shard.safetensors with tensor "w")
put("checkpoint_index", "good.json", '{"metadata": {"total_size": 8}, "weight_map": {"w": "shard.safetensors"}}')
put("checkpoint_index", "escape.json", '{"weight_map": {"w": "../shard.safetensors"}}')
put("checkpoint_index", "missing.json", '{"weight_map": {"w": "shard.safetensors", "v": "shard.safetensors"}}')
put("checkpoint_index", "absolute.json", '{"weight_map": {"w": "/etc/passwd"}}')

# tokenizer.json
byte_level = {
    "version": "1.0",
    "added_tokens": [{"id": 7, "content": "<|end|>", "special": True, "normalized": False},
                     {"id": 8, "content": "<s>", "special": True, "normalized": False}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                               {"Sequence": {"id": "A", "type_id": 0}}],
                       "special_tokens": {"<s>": {"id": "<s>", "ids": [8], "tokens": ["<s>"]}}},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "\u0120": 3, "ab": 4, "abc": 5, "\u0120a": 6},
              "merges": ["a b", "ab c", "\u0120 a"]}}
put("tokenizer_json", "byte_level.json", json.dumps(byte_level))
sentencepiece = {
    "added_tokens": [{"id": 0, "content": "<unk>", "special": True, "normalized": False}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                      {"type": "Replace", "pattern": {"String": " "},
                                                       "content": "\u2581"}]},
    "pre_tokenizer": None,
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                 {"type": "ByteFallback"}, {"type": "Fuse"},
                                                 {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
              "vocab": {"<unk>": 0, "<0xE2>": 1, "\u2581": 2, "h": 3, "i": 4, "\u2581h": 5, "\u2581hi": 6},
              "merges": ["\u2581 h", "\u2581h i"]}}
put("tokenizer_json", "sentencepiece.json", json.dumps(sentencepiece))
split = dict(byte_level)
split["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
put("tokenizer_json", "split_regex.json", json.dumps(split))

# chat templates: first byte even = template text, odd = tokenizer_config.json
chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
put("chat_template", "chatml.bin", b"\x00" + chatml.encode())
put("chat_template", "loops.bin", b"\x00" + b"{% set ns = namespace(x=0) %}{% for i in range(3) %}{% set ns.x = ns.x + i %}"
    b"{{ i|string + ':' }}{% endfor %}{{ ns.x }}{{ messages|length }}{{ messages[-1].content|tojson }}"
    b"{% macro f(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ f(1) }}{{ 'x'|upper if true else '' }}")
put("chat_template", "raise.bin", b"\x00" + b"{{ raise_exception('no system role') }}")
put("chat_template", "config.bin", b"\x01" + json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"},
                                                            "chat_template": "{{ bos_token }}" + chatml}).encode())
put("chat_template", "config_list.bin", b"\x01" + json.dumps({"chat_template": [
    {"name": "default", "template": chatml}, {"name": "tool_use", "template": "{{ tools|tojson }}"}]}).encode())
