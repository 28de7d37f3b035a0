"""``nnx-ppo export``: a run's policy as a :mod:`jax.export` artifact (see :mod:`nnx_ppo.policy`)."""

from __future__ import annotations

from pathlib import Path

from nnx_ppo.app.commands import CliError, ExportCommand, checkpoint_choice, load_run_network, read_run, run_policy_spec
from nnx_ppo.progress import pretty_path


def run_export(cmd: ExportCommand) -> int:
    import jax

    from nnx_ppo.policy import Policy

    run_dir = Path(cmd.run_dir)
    if cmd.batch_size <= 0:
        raise CliError(f"--batch-size must be positive, got {cmd.batch_size}")
    which = checkpoint_choice(cmd)
    saved = read_run(run_dir, rebuild="export it")
    env, spec, ckpt_dir = run_policy_spec(run_dir, saved)
    seeds = [int(s) for s in saved.get("seeds", [])]
    if cmd.seed is not None and cmd.seed not in seeds:
        raise CliError(f"--seed {cmd.seed}: this run trained " +
                       (f"seeds {seeds}" if seeds else "one seed; leave --seed out"))
    seed = cmd.seed if cmd.seed is not None else (seeds[0] if seeds else None)
    network = load_run_network(ckpt_dir, spec.build(env), seed=seed, step=which)
    obs = jax.eval_shape(lambda key: env.reset(key).obs, jax.random.key(0))
    obs = jax.tree.map(lambda x: jax.ShapeDtypeStruct((cmd.batch_size, *x.shape), x.dtype), obs)
    policy = Policy(network, deterministic=not cmd.stochastic)
    try:
        out = policy.export(cmd.out, obs, platforms=cmd.platforms or None)
    except (ValueError, OSError) as e:
        raise CliError(f"cannot export to {cmd.out}: {e}", code=1) from None
    what = {None: "final policy", "best": "best evaluated policy"}.get(which, f"policy at step {which}")
    print(f"exported the {what} of {pretty_path(run_dir)}" + (f" (seed {seed})" if seed is not None else "") +
          f" for batches of {cmd.batch_size} to {out}: step.jax, initial_carry.jax, params.npz, policy.json "
          "(load with jax.export alone; see nnx_ppo.policy.load_exported)")
    return 0
