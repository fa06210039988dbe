"""The episode metrics reach ``trainer.callback_metrics``: what ``ModelCheckpoint`` and ``EarlyStopping`` monitor.

``EpisodeStatsLogger`` logs ``return`` (the recent mean return) and
``env_steps`` every ``every_n_steps`` batches, whether or not the Trainer has
a progress bar or a logger. Each test runs with both Lightning packages.
"""

from __future__ import annotations

import pytest
import torch
from test_lightning import build_pipeline, q_module_class, trainer

import ptl_rl


class MetricsAtEveryStep:
    """A callback (after EpisodeStatsLogger, before ModelCheckpoint) that copies what a monitor sees at each step."""

    def __init__(self, source: ptl_rl.ExperienceSource) -> None:
        self.source = source
        self.seen: list[tuple[int, dict[str, float], dict[str, float]]] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k in ("return", "env_steps")}
        self.seen.append((trainer.global_step, metrics, self.source.episode_stats()))


def recorder_class(L):  # noqa: N803
    return type("Recorder", (MetricsAtEveryStep, L.Callback), {})


@pytest.mark.parametrize(("bar", "prog_bar"), [(False, True), (True, True), (False, False)])
def test_return_and_env_steps_are_callback_metrics_with_or_without_a_bar(L, bar: bool, prog_bar: bool, tmp_path):
    net, sampler = build_pipeline()
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    recorder = recorder_class(L)(source)
    fit = trainer(
        L, max_steps=120, enable_progress_bar=bar, default_root_dir=tmp_path,
        callbacks=[ptl_rl.EpisodeStatsLogger(sampler, every_n_steps=10, prog_bar=prog_bar), recorder],
    )  # fmt: skip
    fit.fit(q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler))
    points = [(step, metrics, stats) for step, metrics, stats in recorder.seen if step % 10 == 0]
    assert len(points) == 12
    for _, metrics, stats in points:  # at each point, the values of that moment, not older ones
        assert metrics["env_steps"] == stats["env_steps"]
        if "return_mean" in stats:
            assert metrics["return"] == pytest.approx(stats["return_mean"], rel=1e-6)
    assert "return" in fit.callback_metrics and "env_steps" in fit.callback_metrics
    assert ("return" in fit.progress_bar_metrics) == prog_bar


def test_model_checkpoint_keeps_the_best_return(L, tmp_path) -> None:
    net, sampler = build_pipeline()
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    recorder = recorder_class(L)(source)
    best = L.callbacks.ModelCheckpoint(
        dirpath=tmp_path, monitor="return", mode="max", save_top_k=1, every_n_train_steps=20
    )
    fit = trainer(
        L, max_steps=200, enable_checkpointing=True, default_root_dir=tmp_path,
        callbacks=[ptl_rl.EpisodeStatsLogger(sampler, every_n_steps=10), recorder, best],
    )  # fmt: skip
    fit.fit(q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler))
    monitored = [metrics["return"] for step, metrics, _ in recorder.seen if step % 20 == 0 and "return" in metrics]
    assert len(monitored) >= 5 and len(set(monitored)) > 1  # the return moved: "best" means something
    assert best.best_model_score is not None
    assert float(best.best_model_score) == pytest.approx(max(monitored), rel=1e-6)
    saved = torch.load(best.best_model_path, weights_only=True)
    assert saved["global_step"] in {
        step for step, metrics, _ in recorder.seen if metrics.get("return") == max(monitored)
    }


def test_early_stopping_on_the_return_stops_the_run(L) -> None:
    net, sampler = build_pipeline()
    source = ptl_rl.find_stage(sampler, ptl_rl.ExperienceSource)
    stop = L.callbacks.EarlyStopping(
        monitor="return", mode="max", stopping_threshold=5.0, check_on_train_epoch_end=True
    )
    fit = trainer(L, max_steps=10_000, callbacks=[ptl_rl.EpisodeStatsLogger(sampler, every_n_steps=5), stop])
    fit.fit(q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler, steps_per_epoch=25))
    assert fit.global_step == 25  # the first epoch end: CartPole returns are >= 8, above the threshold
    assert stop.stopped_epoch == 0 and fit.should_stop
    assert float(fit.callback_metrics["return"]) == pytest.approx(source.episode_stats()["return_mean"], rel=1e-6)


def test_early_stopping_without_improvement_stops_after_its_patience(L) -> None:
    net, sampler = build_pipeline()
    stop = L.callbacks.EarlyStopping(
        monitor="return", mode="max", patience=2, min_delta=1e6, check_on_train_epoch_end=True
    )
    fit = trainer(L, max_steps=10_000, callbacks=[ptl_rl.EpisodeStatsLogger(sampler, every_n_steps=5), stop])
    fit.fit(q_module_class(L)(net), train_dataloaders=ptl_rl.to_dataloader(sampler, steps_per_epoch=25))
    assert fit.global_step == 75  # first check sets the best; two more without an improvement of 1e6 stop it
