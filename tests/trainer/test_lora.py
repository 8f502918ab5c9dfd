"""LoRA (training/models/lora.py, laid out as peft's): the frozen base sharded with FSDP2, adapter-only gradients,
optimiser state and checkpoints, bit-identical resume, and both exports loaded back with transformers and
peft; the adapted layer against peft's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from tiny import hf_config, hf_model, tiny_config  # noqa: E402

from training.models.decoder import build_model, materialize  # noqa: E402
from training.models.lora import apply_lora, is_adapter  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.05}


def _lora(**overrides):
    from tiered_training.contract.runconfig import LoraConfig

    return LoraConfig(**{**LORA, **overrides})


def trainable_parameters(model, lora) -> int:
    """Adapter parameters of the model the trainer builds for ``model`` with ``lora`` (counted on the meta device)."""
    lm = apply_lora(build_model(model), lora)
    return sum(param.numel() for param in lm.parameters() if param.requires_grad)


def _peft_lora(lm, **overrides):
    """The oracle: peft's own LoRA layers put on ``lm``, only the adapters trainable."""
    import peft

    lora = _lora(**overrides)
    peft.inject_adapter_in_model(peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                 target_modules=list(lora.target_modules)), lm)
    for name, param in lm.named_parameters():
        param.requires_grad_(is_adapter(name))
    return lm


def test_trainable_parameters_are_the_adapters_rank_times_in_plus_out():
    """r x (in + out) per adapted projection and layer: the count the planner's LoRA memory uses."""
    model = tiny_config().model  # hidden 64, kv 2 x 16 = 32, ffn 128, 2 layers
    shapes = {"q_proj": (64, 64), "k_proj": (64, 32), "v_proj": (64, 32), "o_proj": (64, 64),
              "gate_proj": (64, 128), "up_proj": (64, 128), "down_proj": (128, 64)}
    assert trainable_parameters(model, _lora()) == 2 * sum(4 * (i + o) for i, o in shapes.values())
    assert trainable_parameters(model, _lora(rank=8, target_modules=["q_proj", "v_proj"])) == 2 * 8 * (128 + 96)


def test_apply_lora_freezes_the_base_and_starts_as_the_base():
    cfg = tiny_config()
    lm = apply_lora(build_model(cfg.model), _lora())
    trainable = {name for name, p in lm.named_parameters() if p.requires_grad}
    assert trainable and all(is_adapter(name) for name in trainable)
    assert {name for name, _ in lm.named_parameters() if is_adapter(name)} == trainable
    materialize(lm, torch.device("cpu"), seed=1)
    for name, param in lm.named_parameters():  # peft's initialisation: B zeros, A not
        if ".lora_B." in name:
            assert not param.any(), name
        elif ".lora_A." in name:
            assert param.abs().max() > 0, name
    base = build_model(cfg.model)
    materialize(base, torch.device("cpu"), seed=1)
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # B = 0: the adapted model is the base, bit for bit, at the start
        assert torch.equal(lm.eval()(ids), base.eval()(ids))


def test_an_unknown_target_module_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"sft.lora.target_modules: qkv_proj is not a linear layer of the llama model "
                                         r"\(valid: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj\)"):
        apply_lora(build_model(tiny_config().model), _lora(target_modules=["q_proj", "qkv_proj"]))


# -- two ranks on gloo: training, checkpoints, resume, exports --------------------------------


def _init_checkpoint(directory: Path) -> Path:
    """A tiny random Llama checkpoint saved by transformers (the architecture of ``tiny_config``), with the tiny
    chat tokenizer and its chat template, as a published checkpoint ships them."""
    from tiny import tiny_chat_tokenizer

    torch.manual_seed(0)
    hf_model(tiny_config().model).save_pretrained(directory)
    tiny_chat_tokenizer(directory)
    return directory


def _torchrun(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "lora_driver.py"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def _then(*args: object) -> list[str]:
    """A further run of the same launch, after the first (``lora_driver.py --then``)."""
    return ["--then", json.dumps([str(a) for a in args])]


TERM = ("--ac", "full")  # the SIGTERM-stopped run and its resume recompute activations; the reference does not


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory):
    """One launch: the reference run with its exports, then a run stopped by SIGTERM after step 3 (last: the
    signal ends the launch)."""
    root = tmp_path_factory.mktemp("lora")
    _init_checkpoint(root / "init")
    common = ("--root", root, "--init", root / "init")
    first = _torchrun(*_then(*common, "--ckpt", root / "ck-term", *TERM, "--out", root / "term1.json",
                             "--sigterm-after", "3"),
                      *map(str, common), "--ckpt", str(root / "ck-full"), "--out", str(root / "full.json"),
                      "--exports", str(root / "exports"), check=False)
    assert (root / "full.json").is_file(), f"torchrun failed ({first.returncode}):\n{first.stderr[-6000:]}"
    (root / "term1.stderr").write_text(first.stderr)
    return root


@pytest.fixture(scope="module")
def lora_resumed(lora_root):
    """One launch: the resume of the SIGTERM-stopped run, then a run in bf16 and one in fp8 (the launch's
    first run is the resume, in fresh processes)."""
    root = lora_root
    common = ("--root", root, "--init", root / "init")
    _torchrun(*_then(*common, "--ckpt", root / "ck-bf16", "--out", root / "bf16.json", "--precision", "bf16"),
              *_then(*common, "--ckpt", root / "ck-fp8", "--out", root / "fp8.json", "--precision", "fp8"),
              *map(str, common), "--ckpt", str(root / "ck-term"), *TERM, "--out", str(root / "term2.json"))
    return root


def _result(root: Path, name: str) -> dict:
    return json.loads((root / name).read_text())


@pytest.mark.torch
def test_only_the_adapters_get_gradients_and_optimiser_state(lora_root):
    found = _result(lora_root, "full.json")["inspect"]
    adapters = [name for name in found["all"] if is_adapter(name)]
    assert len(adapters) == 2 * 7 * 2  # A and B of 7 projections in 2 layers
    assert found["trainable"] == found["with_grad"] == found["with_state"] == adapters
    assert len(found["all"]) > len(adapters)  # the frozen base is there, sharded, without any of them


@pytest.mark.torch
def test_sharded_adapter_gradients_are_the_unsharded_models(lora_root):
    """FSDP2 with frozen and trainable parameters in one unit: the adapters' gradients, reduce-scattered
    over 2 ranks, are those of the same model unsharded in one process (peft on transformers: both an
    independent implementation)."""
    trained = _trained(lora_root)
    lm = _peft_lora(hf_model(tiny_config().model))
    lm.load_state_dict(trained["state"], strict=True)
    batch = trained["grad_batch"]
    logits = lm.eval()(input_ids=batch[:, :-1]).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
    expected = {name: p.grad for name, p in lm.named_parameters() if p.grad is not None}
    assert set(trained["grads"]) == set(expected) and len(expected) == 2 * 7 * 2
    for name, grad in trained["grads"].items():
        # The same fp32 sums in another order (chunked loss, sharded reduction). Each element sums fewer
        # than 2 x 32 x 256 = 2^14 products, so its rounding error is below 2^14 x 2^-24 = 2^-10 of their
        # magnitudes, bounded here by the tensor's largest element. A gradient left unreduced on one rank
        # (half of it) or scaled twice is off by far more.
        scale = float(expected[name].abs().max())
        assert scale > 0, name
        torch.testing.assert_close(grad, expected[name], rtol=0, atol=2**-10 * scale, msg=name)


@pytest.mark.torch
def test_checkpoints_hold_the_adapters_and_their_optimiser_state_not_the_base(lora_root):
    from torch.distributed.checkpoint import FileSystemReader

    from tiered_training.contract.runconfig import LoraConfig
    from training.components.checkpoint import list_steps, step_dir

    ckpt = lora_root / "ck-full"
    assert list_steps(ckpt) == [8, 4]
    metadata = FileSystemReader(str(step_dir(ckpt, 8))).read_metadata().state_dict_metadata
    model_keys = [key for key in metadata if key.startswith("model.")]
    moments = [key for key in metadata if key.startswith("optimizer.state.")]
    assert len(model_keys) == 2 * 7 * 2 and all(is_adapter(key) for key in model_keys)
    assert len(moments) == 3 * len(model_keys) and all(is_adapter(key) for key in moments)  # step, exp_avg, exp_avg_sq

    def numel(keys):
        return sum(metadata[key].size.numel() for key in keys if hasattr(metadata[key], "size"))

    # the tensors saved: the adapters and their two AdamW moments; not one weight of the base
    adapters = trainable_parameters(tiny_config().model, LoraConfig(**LORA))
    assert numel(model_keys) == adapters
    assert numel(moments) == 2 * adapters + len(model_keys)  # plus one scalar step per parameter
    assert adapters < tiny_config().model.parameters / 10


@pytest.mark.torch
def test_resume_after_sigterm_is_bit_identical(lora_resumed):
    """The interrupted and resumed runs recompute activations (full checkpointing, LoRA dropout
    replayed from the saved RNG state); the reference does not: the losses agree to the last bit."""
    root = lora_resumed
    stopped = _result(root, "term1.json")
    assert stopped["stopped"], (root / "term1.stderr").read_text()[-3000:]
    resumed = _result(root, "term2.json")
    assert resumed["resumed_from"] == stopped["step"] and resumed["step"] == 8
    full = _result(root, "full.json")["losses"]
    assert resumed["losses"] == {k: v for k, v in full.items() if int(k) > stopped["step"]}  # every float digit
    assert stopped["losses"] == {k: v for k, v in full.items() if int(k) <= stopped["step"]}


def _trained(root: Path) -> dict:
    return torch.load(root / "exports" / "trained.pt")


@pytest.mark.torch
def test_the_merged_export_is_ready_to_serve_with_a_text_generation_pipeline(lora_root):
    """The folder holds the weights, the starting checkpoint's tokenizer and chat template, and its generation
    config: transformers' pipeline loads it by path alone and answers a chat, its prompt built by the template."""
    from transformers import AutoTokenizer, pipeline

    init, merged = lora_root / "init", lora_root / "exports" / "merged-fp32"
    names = {path.name for path in merged.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json"} <= names
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (merged / name).read_bytes() == (init / name).read_bytes(), name
    generation = json.loads((init / "generation_config.json").read_text())  # eos 2 (<eos>); the template ends turns with 4
    assert json.loads((merged / "generation_config.json").read_text()) == {**generation, "eos_token_id": [2, 4]}
    generator = pipeline("text-generation", model=str(merged), device="cpu")
    messages = [{"role": "user", "content": "reverse words please"}]
    (out,) = generator(messages, max_new_tokens=4, do_sample=False, return_tensors=True)
    prompt = AutoTokenizer.from_pretrained(init).apply_chat_template(messages, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    ids = out["generated_token_ids"]
    assert ids[: len(prompt)] == prompt and len(prompt) < len(ids) <= len(prompt) + 4


def test_an_export_without_a_generation_config_gets_one_with_the_models_and_tokenizers_special_ids(tmp_path):
    from tiny import tiny_chat_tokenizer

    from training.export import serving_files

    init, out = tiny_chat_tokenizer(tmp_path / "init"), tmp_path / "out"
    out.mkdir()
    config = {"bos_token_id": None, "eos_token_id": 4, "pad_token_id": None}  # <|im_end|>; the tokenizer's eos is <eos>
    written = serving_files(init, out, config)
    assert "tokenizer.json" in written and "chat_template.jinja" in written
    assert json.loads((out / "generation_config.json").read_text()) == {"eos_token_id": [4, 2], "pad_token_id": 1}
    (tmp_path / "scratch").mkdir()  # from scratch (no starting checkpoint): the config's ids only
    assert serving_files(None, tmp_path / "scratch", {"eos_token_id": 2}) == ["generation_config.json"]


def test_a_base_llama_under_its_chat_template_exports_the_templates_end_of_turn_as_eos(tmp_path):
    """Llama 3.1 base: its generation_config.json and tokenizer end text with <|end_of_text|> (128001) only; under
    the chat template a turn ends with <|eot_id|> (128009), so the export stops at either."""
    from chat_families import family_tokenizer

    from training.export import serving_files

    init, out = family_tokenizer(tmp_path / "init", "llama3.1", marked=False), tmp_path / "out"
    out.mkdir()
    names = json.loads((init / "tokenizer_config.json").read_text())
    names["eos_token"] = "<|end_of_text|>"  # as the base model's tokenizer names it
    (init / "tokenizer_config.json").write_text(json.dumps(names))
    vocab = {t["content"]: t["id"] for t in json.loads((init / "tokenizer.json").read_text())["added_tokens"]}
    end_of_text, end_of_turn = vocab["<|end_of_text|>"], vocab["<|eot_id|>"]
    base = {"bos_token_id": vocab["<|begin_of_text|>"], "eos_token_id": end_of_text, "temperature": 0.6}
    (init / "generation_config.json").write_text(json.dumps(base))
    serving_files(init, out, {"eos_token_id": end_of_text})
    assert json.loads((out / "generation_config.json").read_text()) == {**base, "eos_token_id": [end_of_text, end_of_turn]}
    (init / "generation_config.json").unlink()  # none: written from the config, the tokenizer and the template
    serving_files(init, out, {"eos_token_id": end_of_text})
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [end_of_text, end_of_turn]


@pytest.mark.torch
def test_merged_export_loads_with_transformers_and_gives_the_trainers_logits(lora_root):
    from transformers import LlamaForCausalLM

    from training.models.lora import base_name

    trained = _trained(lora_root)
    state, ids, expected = trained["state"], trained["tokens"], trained["logits"]
    # bf16 (the default): every weight is W + alpha / r * B @ A, merged in fp32 and rounded to bf16.
    # Against the exact (fp64) value: the fp32 merge errs by at most (r + 2) u |W| + s |B| |A| (a dot
    # product of r terms, then a scale and an add; u = 2^-24), and bf16 rounding moves a value by at most
    # half an ulp, 2^-8 of it; the two roundings may fall on either side: 2^-7 |exact|.
    merged = LlamaForCausalLM.from_pretrained(lora_root / "exports" / "merged-bf16", torch_dtype=torch.bfloat16)
    weights = merged.state_dict()
    scale, rank = LORA["alpha"] / LORA["rank"], LORA["rank"]
    adapted = 0
    for name, value in state.items():
        if is_adapter(name):
            continue
        exact, magnitude = value.double(), value.double().abs()
        if name.endswith("base_layer.weight"):
            prefix = name[: -len("base_layer.weight")]
            a, b = state[f"{prefix}lora_A.default.weight"].double(), state[f"{prefix}lora_B.default.weight"].double()
            exact = exact + scale * b @ a
            magnitude = magnitude + scale * b.abs() @ a.abs()
            adapted += 1
        error = (weights[base_name(name)].double() - exact).abs()
        bound = 2**-7 * exact.abs() + (rank + 2) * 2**-24 * magnitude
        assert bool((error <= bound).all()), (name, float((error - bound).max()))
    assert adapted == 2 * 7
    # fp32: the same function as the trainer's up to fp32 rounding of the merged weights (relative 2^-24)
    # and the order of one sum per projection (x W^T + s (x A^T) B^T against x (W + s B A)^T, at most
    # 128 terms): within torch.testing's fp32 tolerance (rtol 1.3e-6, atol 1e-5), as the trainer's
    # own logits are against transformers' (test_init_checkpoint).
    merged = LlamaForCausalLM.from_pretrained(lora_root / "exports" / "merged-fp32", torch_dtype=torch.float32).eval()
    base = LlamaForCausalLM.from_pretrained(lora_root / "init", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        got, untrained = merged(input_ids=ids).logits, base(input_ids=ids).logits
    torch.testing.assert_close(got, expected)
    assert (untrained - expected).abs().max() > 100 * 1e-5  # the adapters matter far beyond the tolerance


@pytest.mark.torch
def test_adapter_export_loads_with_peft_and_gives_the_trainers_logits(lora_root):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    trained = _trained(lora_root)
    adapter = lora_root / "exports" / "adapter"
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-org/tiny-llama"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    base = LlamaForCausalLM.from_pretrained(lora_root / "init", torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    for name, value in model.state_dict().items():  # every adapter weight loaded, exactly (fp32)
        if ".lora_" in name:
            assert torch.equal(value, trained["state"][name.removeprefix("base_model.model.")]), name
    with torch.no_grad():
        got = model(input_ids=trained["tokens"]).logits
    # the trainer's computation (base output plus scaled adapter output, unmerged) on the same fp32
    # weights; only the matmuls' blocking differs: torch.testing's fp32 defaults
    torch.testing.assert_close(got, trained["logits"])


def test_float8_converts_the_frozen_base_and_leaves_the_adapters_in_high_precision():
    """FP8 after LoRA: the base projections inside peft's layers become Float8Linear; the adapters
    (rank 16: aligned, so only the filter keeps them) stay plain Linear and alone get gradients."""
    pytest.importorskip("torchao")
    from tiny import lm_loss, tiny_lm
    from torch import nn
    from torchao.float8.float8_linear import Float8Linear

    from tiered_training.contract.runconfig import PrecisionConfig
    from training.components import float8

    lm = apply_lora(tiny_lm(), _lora(rank=16)).to(torch.bfloat16)
    precision = PrecisionConfig(precision="fp8", fp8_recipe="tensorwise", activation_checkpointing="none")
    converted = float8.apply_float8(lm, precision, emulate=True)
    assert len(converted) == 2 * 7 and all(name.endswith(".base_layer") for name in converted)
    assert all(isinstance(lm.get_submodule(name), Float8Linear) for name in converted)
    adapters = [m for name, m in lm.named_modules() if name.endswith((".lora_A.default", ".lora_B.default"))]
    assert len(adapters) == 2 * 7 * 2 and all(type(m) is nn.Linear for m in adapters)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    lm_loss(lm, ids).backward()
    with_grad = {name for name, p in lm.named_parameters() if p.grad is not None}
    assert with_grad == {name for name, _ in lm.named_parameters() if is_adapter(name)}


def test_merged_qwen2_weights_keep_the_biases_and_give_the_adapted_models_logits(tmp_path):
    """Qwen2 (q/k/v biases): the trainer's adapted decoder's merged weights load strictly into transformers'
    Qwen2ForCausalLM, whose logits are the adapted model's; and the peft export loads back onto the base
    with the same logits."""
    from peft import PeftModel
    from transformers import Qwen2ForCausalLM

    from training.models.decoder import CausalLM, read_config
    from training.models.lora import export_adapter, merged_weights

    config = hf_config(tiny_config(model={"name": "tiny-qwen", "qkv_bias": True}).model)
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(config)
    base.save_pretrained(tmp_path / "base")
    lm = CausalLM(read_config(tmp_path / "base"))
    lm.load_state_dict(base.state_dict(), strict=True)
    lm = apply_lora(lm, _lora())
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)  # biases that matter
            elif ".lora_B." in name:
                param.normal_(0.0, 0.05)  # a trained adapter: B is no longer zero
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = lm.eval()(ids)
    merged = Qwen2ForCausalLM(config)
    merged.load_state_dict(dict(merged_weights(lm, lm.state_dict())), strict=True)  # every name, biases included
    with torch.no_grad():
        # the same function, fp32 rounding and summation order apart: torch.testing's fp32 defaults
        torch.testing.assert_close(merged.eval()(input_ids=ids).logits, expected)
    export_adapter(lm, lm.state_dict(), _lora(), tmp_path / "adapter")
    trained_base = Qwen2ForCausalLM(config)  # the base with the changed biases, without the adapters
    trained_base.load_state_dict({name.replace(".base_layer.", "."): value for name, value in lm.state_dict().items()
                                  if ".lora_" not in name}, strict=True)
    peft_model = PeftModel.from_pretrained(trained_base, tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(peft_model(input_ids=ids).logits, expected)


def test_an_adapted_layer_computes_what_peft_computes():
    """The same base and adapter weights, with dropout off: the trainer's LoraLinear and peft's lora.Linear
    give the same outputs and adapter gradients bit for bit, under the same parameter names."""
    from tiny import lm_loss, tiny_lm

    ours = apply_lora(tiny_lm(), _lora(dropout=0.0))
    with torch.no_grad():
        for name, param in ours.named_parameters():
            if ".lora_B." in name:
                param.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))  # a trained adapter
    theirs = _peft_lora(tiny_lm(), dropout=0.0)
    assert set(theirs.state_dict()) == set(ours.state_dict())
    theirs.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(ours(ids), theirs(ids))
    lm_loss(ours, ids).backward()
    lm_loss(theirs, ids).backward()
    grads = {name: p.grad for name, p in theirs.named_parameters() if p.grad is not None}
    assert set(grads) == {name for name, p in ours.named_parameters() if p.grad is not None} and len(grads) == 2 * 7 * 2
    for name, param in ours.named_parameters():
        if param.grad is not None:
            assert torch.equal(param.grad, grads[name]), name


def test_the_adapter_config_is_what_peft_writes_for_the_same_settings(tmp_path):
    """The fields peft reads back (rank, alpha, dropout, targets, bias, task) equal what peft's own
    LoraConfig.save_pretrained writes for the same settings."""
    import peft

    from training.models.lora import adapter_config

    lora = _lora()
    peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules),
                    bias="none", task_type="CAUSAL_LM", base_model_name_or_path="base").save_pretrained(str(tmp_path))
    written = json.loads((tmp_path / "adapter_config.json").read_text())
    ours = adapter_config(lora, "base")
    for key, value in ours.items():
        expected = written[key]
        if key == "target_modules":
            expected = sorted(expected)
        assert value == expected, key
    assert peft.LoraConfig.from_pretrained(str(tmp_path)).r == lora.rank


@pytest.mark.torch
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_under_mixed_precision_the_frozen_base_is_stored_in_bf16_and_the_adapters_train(lora_resumed, precision):
    """The frozen base takes 2 bytes per parameter (the dtype FSDP2 gathers it in), not 4; the adapters stay
    fp32. The fp32 checkpoint loads into it and the adapters learn. (fp8 is emulated on the CPU.)"""
    out = _result(lora_resumed, f"{precision}.json")
    assert out["dtypes"] == {"base": ["torch.bfloat16"], "adapters": ["torch.float32"]}
    losses = [out["losses"][str(step)] for step in range(1, 9)]
    assert max(losses[-2:]) < losses[0] - 0.1, losses  # ln(256) = 5.55 at the start


@pytest.mark.torch
def test_the_adapter_names_its_base_by_id_and_loads_with_auto_peft(lora_root, tmp_path, monkeypatch):
    """AutoPeftModelForCausalLM resolves base_model_name_or_path itself: the recipe's model.hf_id (here a local
    directory of that name stands in for the Hub) gives the base, and the adapter on it the trainer's logits."""
    from peft import AutoPeftModelForCausalLM

    trained = _trained(lora_root)
    (tmp_path / "tiny-org").mkdir()
    (tmp_path / "tiny-org" / "tiny-llama").symlink_to(lora_root / "init")
    monkeypatch.chdir(tmp_path)
    model = AutoPeftModelForCausalLM.from_pretrained(lora_root / "exports" / "adapter", dtype=torch.float32).eval()
    with torch.no_grad():
        got = model(input_ids=trained["tokens"]).logits
    torch.testing.assert_close(got, trained["logits"])


@pytest.mark.parametrize("compiled", [False, True])
def test_a_frozen_float8_weight_computes_its_weight_gradient_eager_and_not_compiled(compiled):
    """What the planner counts for FP8 under LoRA (planning/perf.py): torchao's Float8Linear backward computes the
    weight gradient whether or not the weight needs it; compiled, AOTAutograd drops that unused GEMM."""
    pytest.importorskip("torchao")
    from functorch.compile import make_boxed_func
    from torch import nn
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch.utils._python_dispatch import TorchDispatchMode

    from tiered_training.contract.runconfig import PrecisionConfig
    from training.components import float8

    def backward_gemms(frozen: bool) -> int:
        torch._dynamo.reset()
        model = nn.Sequential(nn.Linear(64, 64, bias=False)).to(torch.bfloat16)
        model[0].weight.requires_grad_(not frozen)
        precision = PrecisionConfig(precision="fp8", fp8_recipe="tensorwise", activation_checkpointing="none")
        assert float8.apply_float8(model, precision, emulate=True) == ["0"]
        x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
        if compiled:
            found: list[int] = []

            def backend(gm, inputs):
                def graph_gemms(g, _):
                    found.append(sum(n.op == "call_function" and "mm" in str(n.target) for n in g.graph.nodes))
                    return make_boxed_func(g.forward)

                forward = lambda g, _: make_boxed_func(g.forward)  # noqa: E731
                return aot_module_simplified(gm, inputs, fw_compiler=forward, bw_compiler=graph_gemms)

            torch.compile(model, backend=backend)(x).sum().backward()
            return found[-1]

        class Count(TorchDispatchMode):
            gemms = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Count.gemms += "mm" in func.__name__
                return func(*args, **(kwargs or {}))

        y = model(x).sum()
        with Count():
            y.backward()
        return Count.gemms

    assert backward_gemms(frozen=False) == 2  # input gradient and weight gradient
    assert backward_gemms(frozen=True) == (1 if compiled else 2)
