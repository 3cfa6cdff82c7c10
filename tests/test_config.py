"""Config validation and translation to vLLM arguments: fast, no engine started."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from deploy import free_port, plan_from_config
from deploy.config import CONFIGS_DIR, ConfigError, Override, load_config, parse_config
from deploy.engine_args import build_launch_plan, engine_arguments
from deploy.preflight import Machine, cpu_binding, preflight

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted(p.name for p in CONFIGS_DIR.glob("*.yaml"))
GPU_NODE = Machine(gpus=8, gpu_memory_gib=80, host_memory_gib=1024)
CPU_BOX = Machine(gpus=0, gpu_memory_gib=0, host_memory_gib=24)


def minimal(**sections) -> dict:
    return {"name": "t", "target": {"model": "org/model-1b"}, **sections}


def problems(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


# --- bad input gets a clear error -------------------------------------------------------------

def test_unknown_key_names_the_nearest_valid_one() -> None:
    assert problems(minimal(speculation={"num_speculativ_tokens": 3})) == [
        "speculation.num_speculativ_tokens: unknown key 'num_speculativ_tokens' in speculation; "
        "did you mean 'num_speculative_tokens'?"]
    assert "did you mean 'parallelism'" in problems(minimal(paralelism={}))[0]


def test_wrong_type_and_range_name_the_field_path() -> None:
    found = problems(minimal(speculation={"drafter": "ngram", "num_speculative_tokens": 0},
                             server={"port": "eighty"}))
    assert any(p.startswith("speculation.num_speculative_tokens: ") and "greater than or equal to 1" in p
               for p in found)
    assert any(p.startswith("server.port: ") and "'eighty'" in p for p in found)
    assert problems(minimal(speculation={"drafter": "lookahead"}))[0].startswith("speculation.drafter: Input should be")


def test_api_key_is_never_accepted_in_the_file() -> None:
    [problem] = problems(minimal(server={"api_key": "sk-secret"}))
    assert "api_key_env" in problem and "sk-secret" not in problem
    [problem] = problems(minimal(engine_args={"api_key": "sk-secret"}))
    assert "server.api_key_env" in problem


def test_engine_args_are_checked_against_vllms_argument_list() -> None:
    [problem] = problems(minimal(engine_args={"enforce_eagr": True}))
    assert "unknown key 'enforce_eagr'" in problem and "did you mean 'enforce_eager'" in problem
    [problem] = problems(minimal(engine_args={"tensor_parallel_size": 2}))
    assert "parallelism.tensor_parallel_size" in problem
    assert parse_config(minimal(engine_args={"enforce_eager": True})).engine_args == {"enforce_eager": True}


def test_drafter_consistency() -> None:
    assert "needs a draft checkpoint" in problems(minimal(speculation={"drafter": "small_model"}))[0]
    assert "takes no draft model" in problems(minimal(speculation={"drafter": "ngram", "model": "x/y"}))[0]
    assert "overlaps" in problems(minimal(speculation={"drafter": "ngram", "schedule": [[1, 8, 4], [8, 16, 2]]}))[0]
    assert "did you mean 'prompt_lookup_max'" in problems(
        minimal(speculation={"drafter": "ngram", "extra": {"prompt_lookup_mx": 3}}))[0]
    # Only specdeploy's plugins can keep sampled requests from drafting; vLLM drafts for all of its own.
    assert "applies to specdeploy's plugin drafters" in problems(
        minimal(speculation={"drafter": "ngram", "draft_max_temperature": 0}))[0]
    assert "greater than or equal to 0" in problems(
        minimal(speculation={"drafter": "bigram", "draft_max_temperature": -1}))[0]
    plugin = {"drafter": "small_model", "implementation": "plugin", "model": "x/y", "temperatures": [0, 1]}
    assert "set speculation.draft_sampling: probabilistic" in \
        parse_config(minimal(speculation=plugin)).speculation.sampling_advice()
    gated = parse_config(minimal(speculation={**plugin, "draft_max_temperature": 0.5})).speculation
    assert gated.draft_max_temperature == 0.5
    assert gated.sampling_advice() is None  # T=1 requests draft nothing: nothing to warn about


def test_draft_sampling_and_the_temperatures_a_config_is_tuned_for() -> None:
    # Probabilistic drafting needs a drafter with a draft distribution; deterministic ones are refused.
    for speculation in ({"drafter": "ngram"}, {"drafter": "suffix"}, {"drafter": "probe"}):
        [problem] = problems(minimal(speculation={**speculation, "draft_sampling": "probabilistic"}))
        assert "draft_sampling: probabilistic needs a drafter that samples" in problem, problem
    # specdeploy's plugins sample their own drafts (plugins/draft_sampling.py): valid for both.
    for speculation in ({"drafter": "bigram"}, {"drafter": "small_model", "model": "x/y", "implementation": "plugin"}):
        config = parse_config(minimal(speculation={**speculation, "draft_sampling": "probabilistic",
                                                   "temperatures": [1]}))
        assert config.speculation.samples_drafts and config.speculation.sampling_advice() is None
    assert "set by the typed fields" in problems(minimal(speculation={
        "drafter": "ngram", "extra": {"draft_sample_method": "probabilistic"}}))[0]
    assert ">= 0" in problems(minimal(speculation={"drafter": "ngram", "temperatures": [0, -0.5]}))[0]
    assert problems(minimal(speculation={"drafter": "ngram", "temperatures": []}))
    # A config tuned for sampled traffic that drafts greedily is told what that costs and what to set.
    greedy = parse_config(minimal(speculation={"drafter": "small_model", "model": "x/y", "temperatures": [1, 0, 0.7]}))
    assert greedy.speculation.temperatures == [0, 0.7, 1]
    assert "set speculation.draft_sampling: probabilistic" in greedy.speculation.sampling_advice()
    plugin = parse_config(minimal(speculation={"drafter": "small_model", "model": "x/y", "implementation": "plugin",
                                               "temperatures": [0.7]}))
    assert "set speculation.draft_sampling: probabilistic" in plugin.speculation.sampling_advice()
    for quiet in ({"drafter": "small_model", "model": "x/y", "temperatures": [0]},
                  {"drafter": "small_model", "model": "x/y", "temperatures": [1], "draft_sampling": "probabilistic"}):
        assert parse_config(minimal(speculation=quiet)).speculation.sampling_advice() is None
    resolved = preflight(parse_config(minimal(speculation={"drafter": "small_model", "model": "org/model-0.1b",
                                                           "temperatures": [1]})), machine=GPU_NODE)
    assert any("draft_sampling: probabilistic" in note for note in resolved.notes)
    assert "draft_sample_method" not in engine_arguments(resolved)["speculative_config"]  # vLLM's default: greedy


def test_multi_node_needs_the_address_of_node_0_or_ray() -> None:
    with pytest.raises(ConfigError, match="nodes > 1 with the mp backend needs master_addr"):
        preflight(load_config("llama70b-7b", ["parallelism.nodes=2", "parallelism.pipeline_parallel_size=2"]),
                  machine=GPU_NODE)
    assert "needs distributed_executor_backend mp" in problems(
        minimal(parallelism={"nodes": 2, "distributed_executor_backend": "uni"}))[0]
    assert parse_config(minimal(parallelism={"tensor_parallel_size": 8, "nodes": 2,
                                             "distributed_executor_backend": "ray"})).parallelism.nodes == 2


def test_each_node_gets_its_command() -> None:
    """vLLM's own multi-node launch: node 0 serves the API, node 1 runs headless workers."""
    from deploy.engine_args import node_plans

    config = load_config("llama70b-7b", ["parallelism.nodes=2", "parallelism.pipeline_parallel_size=2",
                                         "parallelism.master_addr=10.0.0.1"])
    plans = node_plans(preflight(config, machine=GPU_NODE))
    assert [p.node_rank for p in plans] == [0, 1]
    leader, worker = (p.argv for p in plans)
    assert leader[2] == "vllm.entrypoints.openai.api_server" and worker[2] == "deploy.vllm_serve"
    for rank, argv in enumerate((leader, worker)):
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.1"
    assert "--headless" in worker and "--headless" not in leader
    with pytest.raises(ConfigError, match="node rank 2 is not one of the deployment's 2 nodes"):
        build_launch_plan(preflight(config, machine=GPU_NODE), node_rank=2)
    ray = load_config("llama70b-7b", ["parallelism.nodes=2", "parallelism.pipeline_parallel_size=2",
                                      "parallelism.distributed_executor_backend=ray"])
    [head] = node_plans(preflight(ray, machine=GPU_NODE))  # Ray places the workers itself
    assert "--nnodes" not in head.argv


def test_overrides_and_no_spec_from_the_command_line() -> None:
    config = load_config("llama70b-7b", ["speculation.num_speculative_tokens=6", "server.port=9000"])
    assert config.speculation.num_speculative_tokens == 6 and config.server.port == 9000
    with pytest.raises(ConfigError, match="schedule.s K cannot exceed num_speculative_tokens"):
        load_config("llama70b-7b", ["speculation.num_speculative_tokens=2"])
    assert load_config("llama70b-7b.yaml", no_speculation=True).speculation.drafter == "none"
    with pytest.raises(ConfigError, match="unknown key 'prot'"):
        load_config("default", ["server.prot=1"])
    with pytest.raises(ConfigError, match="no such config file; presets in"):
        load_config("no-such-preset")


def test_an_override_is_a_field_path_and_a_value_that_gives_its_text_back() -> None:
    given = Override.parse(" speculation.num_speculative_tokens = 2")
    assert given.path == ("speculation", "num_speculative_tokens") and given.value == 2
    assert given == Override("speculation.num_speculative_tokens", 2)  # a dotted path is split
    assert str(given) == " speculation.num_speculative_tokens = 2"  # as written, for results and reports
    made = [Override(("speculation", "schedule"), [[1, 64, 4]]), Override("speculation.model", None),
            Override("server.host", "127.0.0.1"), Override("speculation.model", "null")]
    assert [str(o) for o in made] == ["speculation.schedule=[[1, 64, 4]]", "speculation.model=null",
                                      "server.host=127.0.0.1", 'speculation.model="null"']
    assert all(Override.parse(str(o)) == o for o in made)
    # The documented strings and the data give the same config.
    assert (load_config("llama70b-7b", [Override("server.port", 9000), "speculation.num_speculative_tokens=6"])
            == load_config("llama70b-7b", ["server.port=9000", "speculation.num_speculative_tokens=6"]))
    with pytest.raises(ConfigError, match="'server.port.x': port is not a section"):
        load_config("default", [Override("server.port.x", 1)])


def test_missing_model_folder_says_how_to_fix(tmp_path: Path) -> None:
    config = parse_config(minimal(target={"model": str(tmp_path / "nowhere")}))
    with pytest.raises(ConfigError) as info:
        preflight(config, machine=CPU_BOX)
    assert "does not exist" in str(info.value) and "embedded:target" in str(info.value)


def fake_model(folder: Path, vocab: int, hidden: int = 64, layers: int = 2, heads: int = 1,
               kv_heads: int | None = None) -> str:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads or heads, "intermediate_size": 4 * hidden,
        "vocab_size": vocab, "max_position_embeddings": 512}))
    write_tokenizer(folder, {f"t{i}": i for i in range(vocab)})
    return str(folder)


def write_tokenizer(folder: Path, vocab: dict[str, int]) -> None:
    """A real tokenizer.json (a word-level model over `vocab`), as the tokenizers library saves it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    Tokenizer(WordLevel(vocab, unk_token=min(vocab, key=vocab.get))).save(str(folder / "tokenizer.json"))


def test_draft_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    target = fake_model(tmp_path / "target", vocab=1000, hidden=256, layers=4)
    draft = fake_model(tmp_path / "draft", vocab=1200)
    config = parse_config(minimal(target={"model": target}, speculation={"drafter": "small_model", "model": draft}))
    with pytest.raises(ConfigError) as info:
        preflight(config, machine=CPU_BOX)
    message = str(info.value)
    assert "vocab_size is 1200 but the target's is 1000" in message and "tokenizer" in message
    same = fake_model(tmp_path / "draft-ok", vocab=1000)
    ok = parse_config(minimal(target={"model": target}, speculation={"drafter": "small_model", "model": same}))
    assert preflight(ok, machine=CPU_BOX).draft is not None


def test_a_hub_id_is_read_from_the_cache_snapshot_its_revision_names(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The snapshot `refs/main` points at, not the newest folder: a stale or half-downloaded
    snapshot beside it is not the model vLLM will load."""
    import huggingface_hub.constants

    repo = tmp_path / "models--org--model-1b"
    fake_model(repo / "snapshots" / "aaa", vocab=1000, hidden=256, layers=4)
    time.sleep(0.01)
    fake_model(repo / "snapshots" / "bbb", vocab=2000, hidden=256, layers=4)  # newer, not main
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("aaa")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    resolved = preflight(parse_config(minimal()), machine=CPU_BOX)
    assert resolved.target.vocab_size == 1000 and not resolved.target.local
    pinned = preflight(parse_config(minimal(target={"model": "org/model-1b", "revision": "bbb"})), machine=CPU_BOX)
    assert pinned.target.vocab_size == 2000


def test_a_draft_with_the_same_number_of_other_tokens_is_refused(tmp_path: Path) -> None:
    target = fake_model(tmp_path / "target", vocab=1000, hidden=256, layers=4)
    draft = fake_model(tmp_path / "draft", vocab=1000)
    shuffled = {f"t{i}": (i + 1) % 1000 for i in range(1000)}  # same size, other ids
    write_tokenizer(tmp_path / "draft", shuffled)
    config = parse_config(minimal(target={"model": target}, speculation={"drafter": "small_model", "model": draft}))
    with pytest.raises(ConfigError, match="as many tokens as the target's but not the same ones: 1000 tokens differ"):
        preflight(config, machine=CPU_BOX)


@pytest.mark.parametrize("file, text, expected", [
    ("config.json", "{not json", "config.json cannot be read"),
    ("config.json", "[1, 2]", "holds a list, not an object"),
    ("config.json", '{"vocab_size": "many"}', "has vocab_size 'many', not a positive integer"),
    ("tokenizer.json", '{"model": {"vocab": {"a": "zero"}}}', "tokenizer.json is malformed"),
    ("tokenizer.json", '{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 1}]}', "tokenizer.json is malformed"),
])
def test_malformed_model_files_are_one_clear_problem(tmp_path: Path, file: str, text: str, expected: str) -> None:
    folder = fake_model(tmp_path / "m", vocab=100)
    (tmp_path / "m" / file).write_text(text)
    with pytest.raises(ConfigError, match=expected):
        preflight(parse_config(minimal(target={"model": folder})), machine=CPU_BOX)


def test_config_files_that_are_not_clean_yaml(tmp_path: Path) -> None:
    cases = {
        "latin1.yaml": (b"name: caf\xe9\ntarget:\n  model: org/m\n", "not UTF-8 text (byte 9)"),
        "twice.yaml": (b"name: x\ntarget:\n  model: org/m\nserver:\n  port: 1\nserver:\n  port: 2\n",
                       "'server' appears twice in one mapping (lines 4 and 6)"),
        "inf.yaml": (b"name: x\ntarget:\n  model: org/m\nserver:\n  startup_timeout_s: .inf\n",
                     "server.startup_timeout_s: Input should be a finite number"),
        "nan.yaml": (b"name: x\ntarget:\n  model: org/m\nengine_args:\n  hf_overrides: {rope_theta: .nan}\n",
                     "holds an infinite or NaN number"),
    }
    for name, (raw, expected) in cases.items():
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(ConfigError) as info:
            load_config(tmp_path / name)
        assert expected in str(info.value), (name, str(info.value))
        assert "\n" not in info.value.problems[0]  # one line
    with pytest.raises(ConfigError, match="the value is not YAML .*quote it"):
        load_config(minimal_file(tmp_path), ["server.port=[1,"])


def minimal_file(folder: Path) -> Path:
    path = folder / "ok.yaml"
    path.write_text(yaml.safe_dump(minimal()))
    return path


def test_ipv6_and_every_interface_hosts_are_checked_not_misread(monkeypatch: pytest.MonkeyPatch) -> None:
    from deploy.launcher import port_is_free

    assert port_is_free("::1", free_port()) and port_is_free("", free_port())
    monkeypatch.setenv("K", "sk-1")
    plan = build_launch_plan(preflight(load_config(minimal_file(Path(tempfile.mkdtemp())),
                                                   ["server.host='::'", "server.api_key_env=K"]), machine=GPU_NODE))
    assert plan.argv[plan.argv.index("--host") + 1] == "::" and plan.base_url.startswith("http://127.0.0.1:")


def test_draft_not_smaller_than_target_is_refused(tmp_path: Path) -> None:
    target = fake_model(tmp_path / "target", vocab=1000)
    draft = fake_model(tmp_path / "draft", vocab=1000, hidden=256, layers=4)
    config = parse_config(minimal(target={"model": target}, speculation={"drafter": "small_model", "model": draft}))
    with pytest.raises(ConfigError, match="is not smaller than the target"):
        preflight(config, machine=CPU_BOX)


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The presets' key variable is set unless a test removes it (a real start refuses without it)."""
    monkeypatch.setenv("SPECDEPLOY_API_KEY", "sk-test")


def test_model_that_cannot_fit_the_machine() -> None:
    with pytest.raises(ConfigError) as info:
        preflight(load_config("llama70b-7b", ["resources.device=auto"]), machine=CPU_BOX)
    assert "GiB of RAM" in str(info.value) and "run this preset on GPUs" in str(info.value)
    with pytest.raises(ConfigError, match="resources.device is cuda but this machine has no NVIDIA GPU"):
        preflight(load_config("llama70b-7b"), machine=CPU_BOX)
    small_gpus = Machine(gpus=2, gpu_memory_gib=24, host_memory_gib=256)
    with pytest.raises(ConfigError) as info:
        preflight(load_config("llama70b-7b"), machine=small_gpus)
    assert "needs 8 GPUs per node" in str(info.value) and "this machine has 2" in str(info.value)
    assert "GiB of GPU memory are usable" in str(info.value)
    preflight(load_config("llama70b-7b"), machine=GPU_NODE)  # fits where it is meant to run


# --- presets translate to the engine arguments they should -----------------------------------

SAMPLED = {"draft_sample_method": "probabilistic"}  # every hub preset serves sampled traffic
EXPECTED_SPEC = {
    "llama70b-7b.yaml": {"method": "draft_model", "model": "meta-llama/Llama-2-7b-chat-hf",
                         "num_speculative_tokens": 4,
                         "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 32, 2], [33, 1024, 0]], **SAMPLED},
    "llama70b-1b.yaml": {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct",
                         "num_speculative_tokens": 5, **SAMPLED},
    "qwen3-4b-0.6b.yaml": {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4,
                           **SAMPLED},
    "smollm2-1.7b-360m.yaml": {"method": "draft_model", "model": "HuggingFaceTB/SmolLM2-360M-Instruct",
                               "num_speculative_tokens": 4, **SAMPLED},
    "llama3.1-8b-eagle3.yaml": {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                "num_speculative_tokens": 3, **SAMPLED},
}
HUB_PRESETS = sorted(EXPECTED_SPEC)


def test_every_preset_is_valid_and_covered() -> None:
    for name in PRESETS:
        load_config(name)
        load_config(name, no_speculation=True)
    assert set(HUB_PRESETS) <= set(PRESETS) and "default.yaml" in PRESETS


@pytest.mark.parametrize("name", HUB_PRESETS)
def test_hub_preset_translation(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_API_KEY", "sk-test")
    resolved = preflight(load_config(name), machine=GPU_NODE)
    args = engine_arguments(resolved)
    config = load_config(name)
    assert args["model"] == config.target.model and args["served_model_name"] == config.name
    assert args["speculative_config"] == EXPECTED_SPEC[name]
    assert args.get("tensor_parallel_size", 1) == config.parallelism.tensor_parallel_size
    plan = build_launch_plan(resolved)
    argv = plan.argv
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == EXPECTED_SPEC[name]
    assert "VLLM_TARGET_DEVICE" not in plan.env and argv[argv.index("--dtype") + 1] == "bfloat16"
    baseline = build_launch_plan(preflight(load_config(name, no_speculation=True), machine=GPU_NODE))
    assert "--speculative-config" not in baseline.argv


def test_api_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECDEPLOY_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="export SPECDEPLOY_API_KEY"):
        preflight(load_config("llama70b-7b"), machine=GPU_NODE)
    # A plan shows where the key will come from, and says what is missing.
    planned = preflight(load_config("llama70b-7b"), machine=GPU_NODE, plan_only=True)
    assert [p for p in planned.machine_problems if "export SPECDEPLOY_API_KEY" in p]
    assert 'VLLM_API_KEY="$SPECDEPLOY_API_KEY"' in build_launch_plan(planned).describe()
    monkeypatch.setenv("SPECDEPLOY_API_KEY", "sk-test-123")
    resolved = preflight(load_config("llama70b-7b"), machine=GPU_NODE)
    assert resolved.machine_problems == []
    plan = build_launch_plan(resolved)
    assert plan.env["VLLM_API_KEY"] == "sk-test-123"
    assert "sk-test-123" not in " ".join(plan.argv) and "sk-test-123" not in plan.describe()


def _deploy_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_dry_run_plans_for_the_machine_the_config_is_meant_for() -> None:
    """On this GPU-less machine, without the key: the 8-GPU command all the same, with warnings."""
    env = {k: v for k, v in os.environ.items() if k != "SPECDEPLOY_API_KEY"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not (Path(p) / "nvidia-smi").exists())  # no GPU here, whatever the host
    dry = _deploy_cli("serve", "llama70b-7b", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "--tensor-parallel-size 8" in dry.stdout and 'VLLM_API_KEY="$SPECDEPLOY_API_KEY"' in dry.stdout
    assert "VLLM_TARGET_DEVICE" not in dry.stdout  # a GPU command, not a CPU one
    warnings = [line for line in dry.stderr.splitlines() if line.startswith("warning: this machine cannot run it")]
    assert any("needs 8 GPUs per node" in w for w in warnings) and any("export SPECDEPLOY_API_KEY" in w
                                                                         for w in warnings), dry.stderr
    check = _deploy_cli("check", "llama70b-7b", env=env)
    assert check.returncode == 1 and "--tensor-parallel-size 8" in check.stdout
    assert "valid, but not on this machine" in check.stdout and "needs 8 GPUs per node" in check.stderr
    real = _deploy_cli("serve", "llama70b-7b", env=env)  # refused before anything starts
    assert real.returncode == 2 and "needs 8 GPUs per node" in real.stderr and "vLLM command" not in real.stdout
    bad = _deploy_cli("serve", "default", "--dry-run", "--set", "parallelism.tensor_parallel_size=5", env=env)
    assert bad.returncode == 2 and "cannot share evenly" in bad.stderr  # the config's own problems stay errors


# --- parallelism: vLLM 0.32's rules before anything starts ------------------------------------

def _parallel(tmp_path: Path, parallelism: dict, speculation: dict | None = None, heads: int = 24, kv: int = 6,
              layers: int = 4, draft_heads: int = 2, **sections) -> list[str]:
    """Problems of a deployment of a fake target (and draft) with these heads and layers."""
    target = fake_model(tmp_path / "target", vocab=1000, hidden=1536, layers=layers, heads=heads, kv_heads=kv)
    draft = fake_model(tmp_path / "draft", vocab=1000, hidden=128, layers=1, heads=draft_heads)
    spec = {"drafter": "small_model", "model": draft, **(speculation or {})}
    config = parse_config(minimal(target={"model": target}, speculation=spec, parallelism=parallelism, **sections))
    try:
        preflight(config, machine=CPU_BOX, check_memory=False)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("parallelism, speculation, expected", [
    ({"tensor_parallel_size": 5}, None, "target.model has 24 attention heads, which 5 tensor-parallel ranks cannot "
                                        "share evenly (vLLM: 'must be divisible by tensor parallel size'). Fix: a "
                                        "tensor_parallel_size of 1, 2, 3, 6, 12"),
    ({"tensor_parallel_size": 4}, None, "target.model has 6 KV heads; 4 tensor-parallel ranks must divide them"),
    ({"tensor_parallel_size": 4}, {"drafter": "none"}, "6 KV heads"),
    ({"tensor_parallel_size": 3}, None, "speculation.model has 2 attention heads, which 3 tensor-parallel ranks"),
    ({"tensor_parallel_size": 2}, {"draft_tensor_parallel_size": 1},
     "draft_tensor_parallel_size is 1 but parallelism.tensor_parallel_size is 2: vLLM 0.32's draft-model path needs"),
    ({"pipeline_parallel_size": 8}, {"drafter": "none"}, "has 4 layers, fewer than pipeline_parallel_size 8"),
    ({"pipeline_parallel_size": 2}, None, "speculation with pipeline_parallel_size > 1 does not run on vLLM 0.32's "
                                          "CPU engine"),
    ({"distributed_executor_backend": "ray"}, None, "vLLM's CPU platform has no Ray support"),
])
def test_parallelism_vllm_would_refuse_is_refused_before_start(tmp_path: Path, parallelism: dict,
                                                                 speculation: dict | None, expected: str) -> None:
    found = _parallel(tmp_path, parallelism, speculation)
    assert any(expected in p for p in found), found


def test_cpu_ranks_get_cores_of_their_own() -> None:
    assert cpu_binding((0, 1), 2) == "0|1"
    assert cpu_binding((0, 1, 2, 3, 4), 2) == "0,1|2,3"
    assert cpu_binding((0,), 2) is None and cpu_binding((0, 1), 1) is None
    two_cores = Machine(gpus=0, gpu_memory_gib=0, host_memory_gib=24, cpu_ids=(0, 1))
    plan = build_launch_plan(preflight(load_config("default", ["parallelism.tensor_parallel_size=2"]),
                                       machine=two_cores))
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in build_launch_plan(preflight(load_config("default"),
                                                                          machine=two_cores)).env
    with pytest.raises(ConfigError, match="2 CPU ranks need a CPU each, but this process may use 1"):
        preflight(load_config("default", ["parallelism.tensor_parallel_size=2"]),
                  machine=Machine(gpus=0, gpu_memory_gib=0, host_memory_gib=24, cpu_ids=(0,)))


@pytest.mark.parametrize("parallelism, speculation", [
    ({"tensor_parallel_size": 2}, None),  # the embedded pair's shape: 24/6 heads, a 2-head draft
    ({"tensor_parallel_size": 2}, {"draft_tensor_parallel_size": 2}),
    ({"tensor_parallel_size": 12}, {"drafter": "none"}),  # more ranks than KV heads: vLLM replicates them
    ({"pipeline_parallel_size": 2, "distributed_executor_backend": "mp"}, {"drafter": "none"}),
    ({"pipeline_parallel_size": 3}, {"drafter": "none"}),  # 4 layers over 3 stages: uneven, as vLLM allows
])
def test_parallelism_vllm_can_run_passes(tmp_path: Path, parallelism: dict, speculation: dict | None) -> None:
    assert _parallel(tmp_path, parallelism, speculation) == []


@pytest.mark.parametrize("section, expected", [
    ({"server": {"host": "0.0.0.0"}}, "host '0.0.0.0' accepts remote clients but no API key is set"),
    ({"server": {"host": "::"}}, "host '::' accepts remote clients"),
    ({"server": {"host": ""}}, "host '' accepts remote clients"),
    ({"server": {"host": "example.org"}}, "host 'example.org' accepts remote clients"),
    ({"env": {"VLLM_API_KEY": ""}}, "'VLLM_API_KEY' is refused: set server.api_key_env"),
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "'LD_PRELOAD' is refused: it loads code"),
    ({"env": {"PYTHONPATH": "/tmp"}}, "'PYTHONPATH' is refused"),
    ({"env": {"VLLM_CPU_KVCACHE_SPACE": "40"}}, "set resources.cpu_kvcache_space_gib"),
    ({"env": {"A=B": "1"}}, "'A=B' is not an environment variable name"),
    ({"engine_args": {"ignore_patterns": ["*", "--host", "0.0.0.0"]}}, "list item '--host' would reach vLLM as a flag"),
    ({"engine_args": {"config": "/tmp/vllm.yaml"}}, "'config' is refused: it reads a whole vLLM config file"),
    ({"engine_args": {"hf_token": "hf_abc"}}, "'hf_token' is refused: a token on the command line"),
    ({"engine_args": {"middleware": ["evil.Middleware"]}}, "'middleware' is refused: it imports code"),
    ({"engine_args": {"worker_cls": "evil.Worker"}}, "'worker_cls' is refused"),
    ({"engine_args": {"enforce_eager": "false"}}, "'enforce_eager' takes true or false, not 'false'"),
])
def test_what_would_open_the_server_or_bypass_a_typed_field_is_refused(section: dict, expected: str) -> None:
    found = problems(minimal(**section))
    assert any(expected in p for p in found), found
    assert not any("hf_abc" in p for p in found)  # a refused secret is not echoed back


def test_remote_binding_needs_a_key_or_an_explicit_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config(minimal(server={"host": "0.0.0.0", "api_key_env": "K"})).server.host == "0.0.0.0"
    assert parse_config(minimal(server={"host": "0.0.0.0", "allow_unauthenticated": True})).server.host == "0.0.0.0"
    for loopback in ("127.0.0.1", "::1", "localhost"):
        assert parse_config(minimal(server={"host": loopback})).server.host == loopback


def test_an_api_key_guards_every_route_through_the_middleware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_API_KEY", "sk-test-123")
    resolved = preflight(load_config("llama70b-7b"), machine=GPU_NODE)
    plan = build_launch_plan(resolved)
    argv = plan.argv
    assert argv[argv.index("--middleware") + 1] == "plugins.auth.GuardEveryRoute"
    assert plan.env["SPECDEPLOY_OPEN_PATHS"] == "/health"
    public = build_launch_plan(preflight(load_config("llama70b-7b", ["server.public_metrics=true"]), machine=GPU_NODE))
    assert public.env["SPECDEPLOY_OPEN_PATHS"] == "/health,/metrics"
    open_server = build_launch_plan(preflight(load_config("llama70b-7b", ["server.api_key_env=null",
                                                                          "server.allow_unauthenticated=true"]),
                                              machine=GPU_NODE))
    assert "--middleware" not in open_server.argv and "SPECDEPLOY_OPEN_PATHS" not in open_server.env


def test_default_preset_on_cpu(embedded_pair) -> None:
    resolved, plan = plan_from_config("default")
    assert resolved.device == "cpu" and plan.env["VLLM_TARGET_DEVICE"] == "cpu"
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.env  # whole GiB only: the kit passes exact bytes
    assert plan.argv[plan.argv.index("--kv-cache-memory-bytes") + 1] == str(2**30)
    assert plan.env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "65"  # not vLLM's 5 s: see ServerConfig
    spec = json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": str(embedded_pair.draft),
                    "num_speculative_tokens": load_config("default").speculation.num_speculative_tokens,
                    "draft_sample_method": "probabilistic"}
    # The suite serves the plumbing target (conftest); `make serve` the cost-faithful one.
    assert plan.argv[plan.argv.index("--model") + 1] == str(embedded_pair.plumbing_target)
    assert any("plumbing target" in note for note in resolved.notes) and "--enforce-eager" in plan.argv
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPECDEPLOY_PAIR", "cost")
        resolved, plan = plan_from_config("default")
        assert plan.argv[plan.argv.index("--model") + 1] == str(embedded_pair.target)
        assert not any("plumbing target" in note for note in resolved.notes) and "--enforce-eager" not in plan.argv
        assert plan.env["SPECDEPLOY_CPU_START"] == "fork"  # engine and worker processes forked (plugins.cpu_start)
        # The code pair by name is the code pair whatever the default pair is.
        env.setenv("SPECDEPLOY_PAIR", "smollm2")
        _, plan = plan_from_config("embedded-code")
        assert plan.argv[plan.argv.index("--model") + 1] == str(embedded_pair.target)
    # engine_args pass through with vLLM's own spelling, booleans included
    _, plan = plan_from_config("default", ["engine_args={enforce_eager: false, max_num_batched_tokens: 512}"])
    assert "--no-enforce-eager" in plan.argv and plan.argv[plan.argv.index("--max-num-batched-tokens") + 1] == "512"


def test_config_in_another_folder_resolves_relative_model_paths(tmp_path: Path, embedded_pair) -> None:
    shutil.copytree(embedded_pair.target, tmp_path / "models" / "mine")
    data = yaml.safe_load((CONFIGS_DIR / "default.yaml").read_text())
    data["target"]["model"] = "./models/mine"
    data["speculation"] = {"drafter": "ngram"}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(data))
    _, plan = plan_from_config(tmp_path / "mine.yaml")
    assert plan.argv[plan.argv.index("--model") + 1] == str((tmp_path / "models" / "mine").resolve())


def test_what_vllm_workers_import_never_imports_deploy() -> None:
    """The plugins read the drafter registry, never deploy (which imports them): no import cycle,
    and nothing of the deployment layer loaded into every worker."""
    code = ("import sys, plugins, plugins.drafters, plugins.auth, plugins.bigram_table, plugins.bigram, "
            "plugins.probe, plugins.small_model; print([m for m in sys.modules if m.split('.')[0] == 'deploy'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_registered_drafter_translates_to_a_vllm_method_or_a_plugin() -> None:
    from plugins.drafters import DRAFTERS

    for name, drafter in DRAFTERS.items():
        if name == "none":
            continue
        model = {"model": "org/draft-0.1b"} if drafter.takes_model else {}
        resolved = preflight(parse_config(minimal(speculation={"drafter": name, **model})), machine=GPU_NODE,
                             environment=name != "bigram")  # a bigram table needs files; its own tests cover it
        if name == "bigram":
            resolved.bigram_table = Path("/tables/bigram.npz")
        spec = engine_arguments(resolved)["speculative_config"]
        assert spec["method"] == (drafter.vllm_method or "custom_class"), name
        assert spec.get("model") == (drafter.plugin() or model.get("model")), name  # native unless told


@pytest.mark.parametrize("bf16", [True, False])
def test_a_cpu_serves_auto_as_the_type_it_computes_and_warns_of_a_slow_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bf16: bool) -> None:
    """On a CPU without bf16 arithmetic (AVX2 only) vLLM's bf16 matmuls are emulated, far slower
    (docs/results.md, R16)."""
    import deploy.cpu_dtype

    monkeypatch.setattr(deploy.cpu_dtype, "native_bf16", lambda: bf16)
    folder = tmp_path / "m"
    fake_model(folder, vocab=32000, hidden=2048, layers=16)  # ~1B parameters

    def weights_gib(resolved) -> float:
        note = next(n for n in resolved.notes if n.startswith("memory estimate"))
        return float(note.split("weights ")[1].split(" GiB")[0])

    auto = preflight(parse_config(minimal(target={"model": str(folder)})), machine=CPU_BOX)
    assert engine_arguments(auto)["dtype"] == ("bfloat16" if bf16 else "float32")
    explicit = preflight(parse_config(minimal(target={"model": str(folder), "dtype": "bfloat16"})), machine=CPU_BOX)
    assert engine_arguments(explicit)["dtype"] == "bfloat16"  # an explicit type is the user's to keep
    # The memory check counts the bytes the served type takes: 4 a weight in float32.
    assert weights_gib(auto) == pytest.approx(weights_gib(explicit) * (1 if bf16 else 2), rel=0.01)
    slow = [n for n in explicit.notes if "without bf16 arithmetic" in n]
    assert bool(slow) == (not bf16) and all("target.dtype: auto" in n for n in slow)
    # On a GPU `auto` stays vLLM's (the checkpoint's type).
    monkeypatch.setenv("SPECDEPLOY_API_KEY", "sk-test")
    gpu = preflight(parse_config(minimal(target={"model": str(folder)})), machine=GPU_NODE)
    assert engine_arguments(gpu)["dtype"] == "auto"
