"""The trainer's run on disk beside what ``transformers.Trainer`` writes: taking the output
directory for a fresh or resumed run (:func:`begin_run`), rlcore's state in each checkpoint
(:func:`save_checkpoint`, :func:`checkpoint_state`, :func:`restore_state`: prompt cursor, prompt sampler, generation count,
the unused part of the generation batch, dynamic sampling's streak, the sampler's RNG, adaptive
entropy control), the plots at the end (:func:`write_plots`) and a tied head's load warning
(:func:`without_tied_keys`). The file formats and locks are :mod:`rlcore.training.checkpoint`'s."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from ..training import checkpoint as ckpt
from ..training.metrics import truncate_jsonl
from ..training.plots import write_plots as draw_plots

logger = logging.getLogger(__name__)


def begin_run(trainer: Any, resume_from_checkpoint: Any) -> str | None:
    """Take ``output_dir`` for this run (one live run per directory: the lock is held until
    ``train()`` returns) and return the checkpoint to resume from (None: a fresh run). A missing,
    foreign or damaged checkpoint is one line, before anything is written; a fresh run never writes
    into another run's directory; nothing is written through a link."""
    a = trainer.args
    path = None
    if a.should_save:
        ckpt.check_not_in_use(a.output_dir)
        ckpt.check_no_links(a.output_dir)
    if resume_from_checkpoint:
        path = ckpt.resolve_resume(resume_from_checkpoint, a.output_dir, a.resume_without_optimizer_state)
    if a.should_save:
        ckpt.acquire_run_lock(a.output_dir)
    try:
        if resume_from_checkpoint:
            ckpt.clean_incomplete(a.output_dir)
            restore_state(trainer, path)
        elif a.should_save:  # the main process checks
            ckpt.check_fresh_output_dir(a.output_dir, a.overwrite_output_dir)
            ckpt.clear_previous_run(a.output_dir)
            trainer.run_id = ckpt.new_run_id()
            ckpt.write_run_id(a.output_dir, trainer.run_id)
    except BaseException:
        end_run(a)
        raise
    return path


def end_run(args: Any) -> None:
    """Release ``output_dir`` (the saving process holds its lock)."""
    if args.should_save:
        ckpt.release_run_lock(args.output_dir)


def checkpoint_state(trainer: Any) -> dict[str, Any]:
    """rlcore's state of the run, saved beside each checkpoint's weights and optimizer."""
    t, a = trainer, trainer.args
    return {
        "global_step": t.state.global_step,
        "cursor": t.cursor.state_dict(),
        "prompt_sampler": {"name": a.prompt_sampler, "state": t.prompt_sampler.state_dict()},
        "generations": t._generations,
        "gen_metrics": t._gen_metrics,
        "dynamic_sampling": t.skip_streak.state_dict() if a.dynamic_sampling else None,
        "run_id": t.run_id,
        "sampler_rng": t.sampler.rng_state() if hasattr(t.sampler, "rng_state") else None,
        # TRL's entropy_ctrl_state.json: the adaptive coefficient and the last measured entropy
        "entropy_control": t.entropy_bonus.state_dict() if t.entropy_bonus is not None and t.entropy_bonus.adaptive else None,
    }


def save_checkpoint(trainer: Any, trial: Any, save: Callable[[], None]) -> None:
    """Write the checkpoint (``save``: ``Trainer._save_checkpoint``, pointed at a hidden temp dir),
    add rlcore's state and the unused micro-batches, then rename it into place and rotate the old
    ones. A failed save removes its partial checkpoint; no room to write it is one line (StorageError)."""
    t = trainer
    run_dir = t._get_output_dir(trial=trial)
    folder = f"checkpoint-{t.state.global_step}"
    with ckpt.saving(run_dir, t.state.global_step) as tmp:
        original = t._get_output_dir
        t._get_output_dir = lambda trial=None: tmp
        try:
            save()
        finally:
            t._get_output_dir = original
        buffer = [dict(mb, batch=mb["batch"].to("cpu")) for mb in t._buffer]
        ckpt.write_state(os.path.join(tmp, folder), checkpoint_state(t), buffer)
        final = ckpt.publish(tmp, run_dir, folder)
    if t.state.best_model_checkpoint and os.path.basename(t.state.best_model_checkpoint) == folder:
        t.state.best_model_checkpoint = final
    if t.args.should_save:
        from transformers.trainer_utils import rotate_checkpoints

        rotate_checkpoints(output_dir=run_dir, save_total_limit=t.args.save_total_limit,
                           best_model_checkpoint=t.state.best_model_checkpoint, use_mtime=True)


def restore_state(trainer: Any, path: str) -> None:
    """Continue the run of checkpoint ``path``: its state back into the trainer, the unused
    micro-batches back on the device, metrics.jsonl cut to the checkpoint's step."""
    t, a = trainer, trainer.args
    state, buffer = ckpt.read_state(path)
    t.run_id = ckpt.check_owner(path, state, a.output_dir) or ckpt.new_run_id()
    if a.should_save and ckpt.read_run_id(a.output_dir) is None:
        ckpt.write_run_id(a.output_dir, t.run_id)  # this directory now continues that run
    if state.get("sampler_rng") is not None and hasattr(t.sampler, "set_rng_state"):
        t.sampler.set_rng_state(state["sampler_rng"])
    if "cursor" in state:
        t.cursor.load_state_dict(state["cursor"])
    if (state.get("prompt_sampler") or {}).get("name") == a.prompt_sampler:
        t.prompt_sampler.load_state_dict(state["prompt_sampler"]["state"])
    t._generations = int(state.get("generations", 0))
    t._gen_metrics = dict(state.get("gen_metrics", {}))
    if state.get("dynamic_sampling") is not None:
        t.skip_streak.load_state_dict(state["dynamic_sampling"])
    if t.entropy_bonus is not None and t.entropy_bonus.adaptive and state.get("entropy_control") is not None:
        t.entropy_bonus.load_state_dict(state["entropy_control"])
    t._buffer = [dict(mb, batch=mb["batch"].to(a.device)) for mb in (buffer or [])]
    truncate_jsonl(a.output_dir, int(state.get("global_step", 0)))


def write_plots(args: Any) -> list[str]:
    """The PNG plots, a courtesy: a failure to draw or write them is one warning line (and no
    plots), never an error that costs the final model or hides the error a run stopped with."""
    try:
        return draw_plots(args.output_dir, max_completion_length=args.max_completion_length)
    except Exception as exc:  # noqa: BLE001 - any plotting fault; the run's outcome stands
        logger.warning("could not write the plots to %s: %s: %s (the run is unaffected; metrics.jsonl has every value)",
                       os.path.join(args.output_dir, "plots"), type(exc).__name__, exc)
        return []


def without_tied_keys(model: Any, load_result: Any) -> Any:
    """A tied head (``lm_head.weight`` is ``embed_tokens.weight``) is not written into a checkpoint,
    and transformers then warned ``There were missing keys in the checkpoint model loaded:
    ['lm_head.weight']`` on every resume of such a model, though nothing was missing. Parameters
    that share their tensor with a loaded one are left out of the warning (and re-tied)."""
    missing = set(load_result.missing_keys)
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    tied = {n for group in names.values() if not set(group) <= missing for n in group if n in missing}
    if tied and hasattr(load_result, "_replace"):
        model.tie_weights()
        load_result = load_result._replace(missing_keys=[k for k in load_result.missing_keys if k not in tied])
    return load_result
