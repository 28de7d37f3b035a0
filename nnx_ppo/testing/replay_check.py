"""Check that a network replays its rollout exactly (the library's guarantee)."""

from __future__ import annotations

import dataclasses

from nnx_ppo.algorithms.replay_diagnosis import diagnose_replay

__all__ = ["ReplayReport", "check_replay_consistency"]


@dataclasses.dataclass
class ReplayReport:
    """Result of :func:`check_replay_consistency`.

    Attributes:
      max_abs_log_ratio: largest ``|log pi_replay - log pi_rollout|``.
      max_value_difference: largest ``|V_replay - V_rollout|``.
      passed: both within ``tolerance``.
      tolerance: the bound used.
      first_divergence: where the replay first departed from the rollout, as
        ``"step t, carry leaf <path> of module layers/1 (MyCell): ..."``
        (the module whose ``initialize_state`` made that carry leaf, by path
        in the network and class), or ``None``.
      n_resets: episode resets inside the rollout (the check is stronger
        with some).
    """

    max_abs_log_ratio: float
    max_value_difference: float
    passed: bool
    tolerance: float
    first_divergence: str | None
    n_resets: int

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        text = (
            f"replay consistency {verdict}: max |log ratio| = {self.max_abs_log_ratio:.3g}, "
            f"max |value difference| = {self.max_value_difference:.3g} (tolerance {self.tolerance:g}); "
            f"{self.n_resets} resets in the rollout"
        )
        if self.first_divergence:
            text += f"; first divergence: {self.first_divergence}"
        return text


def check_replay_consistency(
    network,
    env,
    *,
    n_envs: int = 8,
    rollout_length: int = 32,
    n_minibatches: int = 2,
    seed: int = 0,
    tolerance: float = 1e-5,
    precision: str = "default",
) -> ReplayReport:
    """Run one rollout, then replay it minibatch by minibatch without updating,
    and compare log-likelihoods and values.

    A module that follows the rules (per-env keys in the carry, no write in
    ``__call__`` that changes its output, samplers replaying the stored
    action) passes with errors around 1e-7; one that draws from a
    class-level RNG inside ``__call__`` raises
    :class:`~nnx_ppo.algorithms.driver.ReplayMismatchError` naming it (its
    path in the network and its class), with or without a carry; one whose
    carry the replay does not reproduce fails, and ``first_divergence`` names
    it.
    Writes that leave the output unchanged, such as a call counter, pass.
    Does not modify ``network``. Use an env with episodes shorter than
    ``rollout_length`` so that resets happen inside the rollout.
    ``precision`` is ``PPOConfig.precision``: rollout and replay at it.
    """
    found = diagnose_replay(network, env, n_envs=n_envs, rollout_length=rollout_length,
                            n_minibatches=n_minibatches, seed=seed, tolerance=tolerance, precision=precision)
    passed = found.max_abs_log_ratio <= tolerance and found.max_value_difference <= tolerance
    divergence = found.first_divergence
    if not passed and divergence is None:
        divergence = "outputs differ but every carry matches: a module's output depends on state outside its carry"
    return ReplayReport(
        max_abs_log_ratio=found.max_abs_log_ratio,
        max_value_difference=found.max_value_difference,
        passed=passed,
        tolerance=tolerance,
        first_divergence=divergence,
        n_resets=found.n_resets,
    )
