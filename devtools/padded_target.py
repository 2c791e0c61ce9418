"""A cost-emulating target: SmolLM2 padded with inert transformer blocks.

Each extra block copies the last real block but has all-zero ``attn_output`` and ``ffn_down``
weights, so its attention and FFN add exactly zero to the residual stream: the padded model
computes the same function as the original, while every token pays for ``block_count +
extra_blocks`` blocks. With 270 extra blocks on a 30-block SmolLM2-135M (Q8_0) the target costs
about 8x its Q4_1 draft per token, the shape of an 8B-target / 1B-draft pairing.

This module is the library (the builder, and a greedy decode to compare models with);
``devtools.realmodels.padded_smollm2`` caches the padded model, and ``python
bench/padded_target.py`` prints greedy tokens/s of the Q4_1 draft, the Q8_0 copy and the padded
target, measured in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, ReaderField

# Header fields the writer produces itself.
_WRITER_OWNED_KEYS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture"}
# Projections whose zeroing makes a block add nothing to the residual stream.
_ZEROED_SUFFIXES = (".attn_output.weight", ".ffn_down.weight")


def _field_value(field: ReaderField) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    main_type = field.types[0]
    if main_type != GGUFValueType.ARRAY:
        return field.contents(), main_type, None
    if len(field.types) != 2:
        raise ValueError(f"{field.name}: nested arrays are not supported")
    return field.contents(), main_type, field.types[1]


def _block_index(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1])
    return None


def _extra_block_tensors(
    reader: GGUFReader, last_block: int, extra_blocks: int
) -> Iterator[tuple[str, np.ndarray[Any, Any], GGMLQuantizationType]]:
    template = [t for t in reader.tensors if _block_index(t.name) == last_block]
    zeros = {t.name: np.zeros_like(t.data) for t in template if t.name.endswith(_ZEROED_SUFFIXES)}
    if len(zeros) != len(_ZEROED_SUFFIXES):
        raise ValueError(f"block {last_block} lacks attn_output/ffn_down weights: cannot pad it")
    prefix = f"blk.{last_block}."
    for block in range(last_block + 1, last_block + 1 + extra_blocks):
        for tensor in template:
            name = f"blk.{block}." + tensor.name.removeprefix(prefix)
            data = zeros.get(tensor.name, tensor.data)
            yield name, data, tensor.tensor_type


def build_padded_target(src_q8_0: Path, dst: Path, extra_blocks: int = 270) -> Path:
    """Write ``src_q8_0`` plus ``extra_blocks`` inert blocks to ``dst``; return ``dst``.

    Metadata is copied as is (``<arch>.block_count`` raised, per-layer arrays extended with
    their last value); quantised tensor bytes are copied without conversion.
    """
    reader = GGUFReader(src_q8_0)
    arch_field = reader.get_field("general.architecture")
    if arch_field is None:
        raise ValueError(f"{src_q8_0}: no general.architecture")
    arch = str(arch_field.contents())
    count_field = reader.get_field(f"{arch}.block_count")
    if count_field is None:
        raise ValueError(f"{src_q8_0}: no {arch}.block_count")
    block_count = int(count_field.contents())
    new_count = block_count + extra_blocks

    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name in _WRITER_OWNED_KEYS:
            continue
        value, vtype, sub_type = _field_value(field)
        if field.name == f"{arch}.block_count":
            value = new_count
        elif (
            field.name.startswith(f"{arch}.") and sub_type is not None and len(value) == block_count
        ):
            value = value + [value[-1]] * extra_blocks  # per-layer settings of the copied block
        if field.name == "general.alignment":
            writer.data_alignment = int(value)
        writer.add_key_value(field.name, value, vtype, sub_type=sub_type)

    last_block = block_count - 1
    # The new blocks go right after the last real block's tensors (file order is cosmetic).
    insert_after = max(
        i for i, t in enumerate(reader.tensors) if _block_index(t.name) == last_block
    )
    for i, tensor in enumerate(reader.tensors):
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
        if i == insert_after:
            for name, data, qtype in _extra_block_tensors(reader, last_block, extra_blocks):
                writer.add_tensor(name, data, raw_dtype=qtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


# --- measurement -----------------------------------------------------------------------------

PROMPT = "Write a short story about a robot who learns to paint."


def greedy_tokens(
    model_path: Path, n_tokens: int, *, n_threads: int = 0
) -> tuple[list[int], float]:
    """Greedy tokens from the high-level API and the decode rate (tokens/s, prefill excluded);
    ``n_threads`` 0: every CPU this process may use."""
    from llama_cpp import Llama

    from modelhub.engine.native import default_threads

    n_threads = n_threads or default_threads()
    llm = Llama(
        model_path=str(model_path),
        n_ctx=512,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        flash_attn=True,
        verbose=False,
    )
    messages = [{"role": "user", "content": PROMPT}]
    prompt = llm.tokenize(_chat_prompt(llm, messages).encode(), add_bos=False, special=True)
    tokens: list[int] = []
    start = 0.0
    for i, token in enumerate(llm.generate(prompt, top_k=1, temp=0.0, reset=True)):
        if i == 0:
            start = time.perf_counter()  # the first token includes prefill
        tokens.append(int(token))
        if len(tokens) == n_tokens:
            break
    elapsed = time.perf_counter() - start
    llm.close()
    return tokens, (len(tokens) - 1) / elapsed if elapsed > 0 else float("nan")


def _chat_prompt(llm: Any, messages: list[dict[str, str]]) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata["tokenizer.chat_template"]
    formatter = Jinja2ChatFormatter(template=template, eos_token="", bos_token="")
    return str(formatter(messages=messages).prompt)  # type: ignore[arg-type]
