"""Steps that draft nothing skip the hand-off of drafts: a K = 0 step costs what a plain step costs.

With synchronous scheduling (vLLM 0.32's default on CPUs), after every step of a speculative
server the engine core asks the worker for the drafts it just made (`EngineCore.post_step` ->
`take_draft_token_ids`, an RPC to the worker process) and hands them to the scheduler's requests.
Under a schedule whose K is 0 at the running batch size, every draft is empty, yet the round trip
and the walk over the batch still run: a cost per step (`plugins.step_profile` measures it as
post_step) that a plain server does not have.

`register()`, a vLLM general plugin run in every process, wraps two methods:

- `Scheduler.schedule` notes the step's K: vLLM's own (`num_spec_tokens_to_schedule`, set from
  `num_speculative_tokens_per_batch_size` for native drafters) and, for specdeploy's plugin
  drafters (vLLM gives custom proposers no schedule), the plugin's K at the step's batch size from
  the same lookup the plugin reads (`plugins.k_by_batch_size`); 0 too when every scheduled request
  is sampled above the plugin's `draft_max_temperature` (plugins.temperature_gate drafts for none);
- `EngineCore.post_step` returns at once when that K was 0.

It also gives the engine core a utility, `specdeploy_cap_k` (`call_utility("specdeploy_cap_k", k)`
from an `LLM`'s client): `make tune`'s K sweep caps K in the worker between measurements and
here too, so its K=0 steps skip the hand-off as a tuned server's do and cost what they will cost.

Skipping changes nothing else: the scheduler has already emptied the drafts of every request it
scheduled (`request.spec_token_ids = []`), and the hand-off would have set them to the same empty
lists. Only the plain synchronous loop is touched: async scheduling and the batch queue (pipeline
parallelism) take drafts elsewhere. Without a schedule K is never 0 and nothing is skipped.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

log = logging.getLogger("vllm.specdeploy.k0_handoff")
_WRAPPED = "__specdeploy_k0_handoff__"
_skipped = False  # one log line per process on the first skip


def _plugin_options(vllm_config: Any) -> dict[str, Any] | None:
    """specdeploy's options when a specdeploy plugin drafts; None for native drafters or no speculation."""
    from plugins import specdeploy_options

    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or getattr(spec, "method", None) != "custom_class":
        return None
    return specdeploy_options(vllm_config)


def plugin_k_lookup(vllm_config: Any) -> list[int] | None:
    """K per batch size that a specdeploy plugin drafter reads from the config; None for native
    drafters, plugins without a schedule, or no speculation."""
    from plugins import k_by_batch_size

    options = _plugin_options(vllm_config)
    return None if options is None else k_by_batch_size(vllm_config, options)


def plugin_gate(vllm_config: Any) -> float | None:
    """The plugin drafter's `draft_max_temperature` (plugins.temperature_gate); None: no gate."""
    options = _plugin_options(vllm_config)
    return None if options is None else options.get("draft_max_temperature")


def all_above_gate(scheduler: Any, req_ids: Any, gate: float) -> bool:
    """Whether every scheduled request is sampled above the gate, so the plugin drafts for none.
    Greedy requests count as 0, as the worker's input batch records them."""
    from vllm.sampling_params import SamplingType

    for req_id in req_ids:
        params = scheduler.requests[req_id].sampling_params
        if params.sampling_type == SamplingType.GREEDY or params.temperature <= gate:
            return False
    return True


def step_k(scheduler: Any, output: Any) -> int:
    """The number of draft tokens the proposer makes after this scheduled step."""
    k = int(getattr(output, "num_spec_tokens_to_schedule", 0) or 0)
    lookup = scheduler.__dict__.get("_specdeploy_plugin_k")
    if lookup is None:
        lookup = scheduler._specdeploy_plugin_k = plugin_k_lookup(scheduler.vllm_config) or []
        scheduler._specdeploy_gate = plugin_gate(scheduler.vllm_config)
    batch = len(output.num_scheduled_tokens)
    if lookup and batch:
        k = min(k, lookup[min(batch, len(lookup) - 1)])
    gate = scheduler.__dict__.get("_specdeploy_gate")
    if k and gate is not None and batch and all_above_gate(scheduler, output.num_scheduled_tokens, gate):
        k = 0
    cap = scheduler.__dict__.get("_specdeploy_k_cap")
    return k if cap is None else min(k, cap)


def cap_k(core: Any, k: int | None) -> bool:
    """Engine-core utility: from the next step on, at most K drafts a step (None: no cap), as the
    K sweep's cap in the worker; True once set."""
    core.scheduler._specdeploy_k_cap = None if k is None else int(k)
    return True


def _noting_k(schedule: Callable) -> Callable:
    @functools.wraps(schedule)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = schedule(self, *args, **kwargs)
        try:
            self._specdeploy_step_k = step_k(self, output)
        except Exception:  # noqa: BLE001 - unknown shapes: never skip, never break scheduling
            self._specdeploy_step_k = None
        return output

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _skipping_k0(post_step: Callable) -> Callable:
    @functools.wraps(post_step)
    def wrapper(self: Any, model_executed: bool) -> None:
        if (self.batch_queue is None and not self.async_scheduling
                and getattr(self.scheduler, "_specdeploy_step_k", None) == 0):
            global _skipped
            if not _skipped:
                log.info("specdeploy: a K=0 step of the schedule: its draft hand-off to the scheduler is "
                         "skipped (said once)")
                _skipped = True
            return None  # every draft of this step is empty; the scheduler already holds none
        return post_step(self, model_executed)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def register() -> None:
    """vLLM general-plugin hook: install both wrappers (once per process)."""
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.engine.core import EngineCore

        for owner, name, wrap in ((Scheduler, "schedule", _noting_k), (EngineCore, "post_step", _skipping_k0)):
            method = owner.__dict__[name]
            if not getattr(method, _WRAPPED, False):
                setattr(owner, name, wrap(method))
        EngineCore.specdeploy_cap_k = cap_k  # type: ignore[attr-defined]
    except Exception as exc:  # a later vLLM may have moved things: serve as before, say so
        log.warning("specdeploy: could not install the K=0 hand-off skip (%s); K=0 steps of a schedule "
                    "keep vLLM's draft hand-off", exc)
