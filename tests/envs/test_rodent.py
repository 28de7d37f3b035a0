"""The rodent tasks (docs/rodent.md): the MJX-compatible body, the generated
clips, observation structure, reward and termination logic, and a stand-in
with vnl-playground ``Imitation``'s structure training through the same
path. The default tests compile no MJX step; ``check_env`` on both tasks
(about a minute of compilation each on a 2-core CPU) is marked slow."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("mujoco_playground")
if importlib.util.find_spec("dm_control") is None:
    pytest.skip('the rodent tasks need dm_control: pip install "nnx_ppo[rodent]"', allow_module_level=True)

import mujoco  # noqa: E402
from mujoco import mjx  # noqa: E402
from mujoco_playground._src import mjx_env  # noqa: E402

from nnx_ppo.envs.rodent import body, clips  # noqa: E402


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    """Clips are cached under a temporary folder, not the user's home."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny_clips() -> clips.Clips:
    return clips.generate_clips(n_clips=2, n_frames=24, seed=1, min_speed=0.0)


@pytest.fixture(scope="module")
def imitation(tiny_clips):
    from nnx_ppo.envs.rodent import RodentImitation

    return RodentImitation(clips=tiny_clips)


# ---------------------------------------------------------------------------- the body


def test_body_is_edited_and_mjx_accepts_it():
    model = body.load_model()
    assert (model.nu, model.na, model.nq, model.nv) == (38, 38, 52, 51)
    assert model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE
    assert model.nskin == 0 and model.nsensor == 0
    floor = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "floor")
    assert np.all(model.geom_contype == 0) and np.all(model.geom_conaffinity == 0)
    assert model.npair == 11 and np.all(model.pair_geom1 == floor)
    kinds = {int(t) for t in model.geom_type[model.pair_geom2]}
    assert kinds == {mujoco.mjtGeom.mjGEOM_SPHERE, mujoco.mjtGeom.mjGEOM_CAPSULE}
    assert model.opt.solver == mujoco.mjtSolver.mjSOL_CG and model.opt.iterations == 4
    mjx.put_model(model, impl="jax")  # ellipsoid-box collisions would fail here


def test_body_rests_upright_in_plain_mujoco():
    model = body.load_model()
    data = mujoco.MjData(model)
    for _ in range(500):
        mujoco.mj_step(model, data)
    assert data.qpos[2] > 0.03 and data.xmat[1][8] > 0.95 and np.all(np.isfinite(data.qvel))


def test_missing_dm_control_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r'pip install "nnx_ppo\[rodent\]"'):
        body.rodent_xml_path()


# ---------------------------------------------------------------------------- the clips


def test_generated_clip_is_plausible_and_consistent():
    clip = clips.generate_clips(n_clips=1, n_frames=12, seed=0, min_speed=0.0)
    assert clip.qpos.shape == (1, 12, 52) and clip.qvel.shape == (1, 12, 51) and clip.act.shape == (1, 12, 38)
    assert clip.body_pos.shape == (1, 12, len(body.TRACKED_BODIES), 3)
    assert np.all(np.isfinite(clip.qpos)) and np.all(clip.qpos[0, :, 2] > 0.025)
    # the torso's tracking site sits at the root: body positions and qpos agree
    np.testing.assert_allclose(clip.body_pos[0, :, 0], clip.qpos[0, :, :3], atol=1e-5)
    # the signal moves the joints
    assert np.ptp(clip.qpos[0, :, 7:], axis=0).max() > 0.05


def test_clips_are_cached(tmp_path):
    first = clips.load_clips(n_clips=1, n_frames=10, min_speed=0.0, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("clips-*.npz"))) == 1
    again = clips.load_clips(n_clips=1, n_frames=10, min_speed=0.0, cache_dir=tmp_path)
    np.testing.assert_array_equal(first.qpos, again.qpos)
    clips.load_clips(n_clips=1, n_frames=10, seed=3, min_speed=0.0, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("clips-*.npz"))) == 2


def test_clips_go_somewhere_at_min_speed():
    """The kept clips' roots move at min_speed or faster (start to end), so
    holding still does not track them; a speed no candidate reaches is a
    one-line error naming the argument."""
    moving = clips.generate_clips(n_clips=2, n_frames=100, seed=0, min_speed=0.05)
    distance = np.linalg.norm(moving.qpos[:, -1, :2] - moving.qpos[:, 0, :2], axis=-1)
    assert np.all(distance >= 0.05 * 99 / 50)
    with pytest.raises(RuntimeError, match="min_speed=5.0"):
        clips.generate_clips(n_clips=1, n_frames=20, min_speed=5.0, max_tries=3)


# ---------------------------------------------------------------------------- rodent_imitation


def test_imitation_observation_structure(imitation):
    state = jax.eval_shape(imitation.reset, jax.random.key(0))
    target = {k: v.shape for k, v in state.obs["imitation_target"].items()}
    assert target == {"root": (5, 3), "quat": (5, 4), "joint": (5, 45), "body": (5, len(body.TRACKED_BODIES), 3)}
    proprio = {k: v.shape for k, v in state.obs["proprioception"].items()}
    assert proprio["joint_angles"] == (45,) and proprio["joint_velocities"] == (45,)
    assert proprio["actuator_activation"] == (38,) and proprio["appendages"] == (15,)
    assert state.info["truncated"].shape == () and imitation.action_size == 38


def test_imitation_reset_starts_on_the_reference(imitation, tiny_clips):
    state = jax.jit(imitation.reset)(jax.random.key(3))
    clip, frame = int(state.info["clip"]), int(state.info["frame"])
    np.testing.assert_allclose(state.data.qpos, tiny_clips.qpos[clip, frame], atol=1e-6)
    target = state.obs["imitation_target"]
    # the first target frame is the next reference frame, relative to the current pose
    np.testing.assert_allclose(target["joint"][0], tiny_clips.qpos[clip, frame + 1, 7:] - state.data.qpos[7:],
                               atol=1e-5)
    assert float(jnp.abs(target["quat"][0, 0])) > 0.99  # nearly no rotation between neighbouring frames


def test_imitation_rewards_and_termination(imitation, tiny_clips):
    from nnx_ppo.envs.rodent.tasks import Pose

    ref = Pose(*(jnp.asarray(x[0, 5]) for x in (tiny_clips.qpos, tiny_clips.qvel, tiny_clips.act,
                                                tiny_clips.body_pos)))
    perfect = imitation._tracking(ref, ref)
    assert all(abs(float(v) - 1.0) < 1e-5 for v in perfect.values())
    assert not bool(imitation._terminated(ref, ref))
    moved = ref.replace(qpos=ref.qpos.at[0].add(0.2), body_pos=ref.body_pos.at[:, 0].add(0.2))
    assert bool(imitation._terminated(moved, ref))
    assert float(imitation._tracking(moved, ref)["root_pos"]) < 1e-3
    flipped = ref.replace(qpos=ref.qpos.at[3:7].set(jnp.array([0.0, 1.0, 0.0, 0.0])))
    assert bool(imitation._terminated(flipped, ref))
    bent = ref.replace(qpos=ref.qpos.at[7:].add(1.0))
    assert bool(imitation._terminated(bent, ref))
    costs = imitation._costs(jnp.ones(38), jnp.zeros(38))
    assert float(costs["control_cost"]) == pytest.approx(0.02 * 38)


def test_imitation_truncates_at_the_clip_end(imitation):
    last = imitation._last_frame
    assert last == 24 - 1 - 5
    done, truncated = imitation._episode_end(jnp.array(False), jnp.array(last - 1))
    assert (float(done), float(truncated)) == (0.0, 0.0)
    done, truncated = imitation._episode_end(jnp.array(False), jnp.array(last))
    assert (float(done), float(truncated)) == (1.0, 1.0)
    done, truncated = imitation._episode_end(jnp.array(True), jnp.array(last))  # a failure stays a termination
    assert (float(done), float(truncated)) == (1.0, 0.0)


def test_registered_and_adapted():
    from nnx_ppo.envs import list_envs, make
    from nnx_ppo.envs.adapters import PlaygroundEnv
    from nnx_ppo.envs.wrappers import TimeLimit

    assert {"rodent_imitation", "rodent_run"} <= set(list_envs())
    env = make("rodent_imitation", n_clips=2, clip_frames=30)
    assert isinstance(env, TimeLimit) and isinstance(env.env, PlaygroundEnv) and env.max_steps == 150
    assert set(env.observation_space) == {"proprioception", "imitation_target"}
    assert env.action_space.shape == (38,)


# ---------------------------------------------------------------------------- rodent_run


def test_run_rewards_and_falls():
    from nnx_ppo.envs.rodent import RodentRun

    env = RodentRun()
    rest = env._rest
    assert float(rest.qpos[2]) > 0.03 and not bool(env._fell(rest))
    reward, metrics = env._terms(rest, jnp.zeros(38))
    assert float(metrics["reward/upright"]) == pytest.approx(0.2, abs=1e-2)
    assert abs(float(metrics["speed"])) < 1e-3
    moving = rest.replace(qvel=rest.qvel.at[0].set(1.0))  # faster than the target speed, heading +x
    assert float(env._terms(moving, jnp.zeros(38))[1]["reward/forward"]) == pytest.approx(1.0, abs=0.05)
    assert bool(env._fell(rest.replace(qpos=rest.qpos.at[2].set(0.01))))
    state = jax.eval_shape(env.reset, jax.random.key(0))
    assert set(state.obs) == {"proprioception"} and state.info["truncated"].shape == ()


# ---------------------------------------------------------------------------- a vnl-playground-shaped env


class VnlShapedImitation(mjx_env.MjxEnv):
    """A pure-JAX stand-in with vnl-playground ``Imitation``'s observation,
    action and info structure: ``{"proprioception": {...}, "imitation_target":
    {root, quat, joint, body}}``, 38 actions, ``info["truncated"]`` at the
    clip's end (every 12 steps), a termination when the action strays."""

    W, JOINTS, BODIES, CLIP = 5, 67, 18, 12

    def __init__(self):
        from ml_collections import config_dict

        super().__init__(config_dict.create(ctrl_dt=0.02, sim_dt=0.002))

    xml_path = "stand-in"
    mj_model = mjx_model = None
    action_size = 38

    def _obs(self, t, pos):
        phase = (t + jnp.arange(1, self.W + 1, dtype=jnp.float32))[:, None] * 0.3
        return {"proprioception": {"joint_angles": jnp.sin(phase[0, 0] + jnp.arange(self.JOINTS) * 0.1),
                                   "position": pos},
                "imitation_target": {"root": jnp.sin(phase + jnp.arange(3)[None]) - pos[None, :3],
                                     "quat": jnp.cos(phase + jnp.arange(4)[None]),
                                     "joint": jnp.sin(phase + jnp.arange(self.JOINTS)[None] * 0.1),
                                     "body": jnp.sin(phase[:, :, None] + jnp.zeros((1, self.BODIES, 3)))}}

    def reset(self, rng):
        pos = jax.random.normal(rng, (38,)) * 0.1
        t = jnp.zeros((), jnp.int32)
        info = {"frame": t, "truncated": jnp.zeros(()), "action": jnp.zeros(38)}
        return mjx_env.State(pos, self._obs(t, pos), jnp.zeros(()), jnp.zeros(()), {"tracking": jnp.zeros(())},
                             info)

    def step(self, state, action):
        t = state.info["frame"] + 1
        pos = 0.9 * state.data + 0.1 * action
        target = jnp.sin(t * 0.3 + jnp.arange(38) * 0.1)
        reward = jnp.exp(-jnp.sum(jnp.square(pos - target)))
        terminated = jnp.max(jnp.abs(action)) > 0.999
        truncated = jnp.logical_and(t >= self.CLIP, jnp.logical_not(terminated)).astype(jnp.float32)
        done = jnp.logical_or(terminated, truncated > 0).astype(jnp.float32)
        info = {**state.info, "frame": t, "truncated": truncated, "action": action}
        return state.replace(data=pos, obs=self._obs(t, pos), reward=reward, done=done,
                             metrics={"tracking": reward}, info=info)


def test_vnl_shaped_imitation_trains_unchanged():
    import warnings

    from nnx_ppo import train_ppo
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.envs import as_env
    from nnx_ppo.testing import check_env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check_env(VnlShapedImitation(), n_envs=4, n_steps=16)
        assert report.truncated.sum() > 0  # info["truncated"] reaches the trainer's env API
        assert as_env(VnlShapedImitation()).action_space.shape == (38,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a subclass of MjxEnv takes the Playground adapter, with no note
        adapted = as_env(VnlShapedImitation())
    assert type(adapted).__name__ == "TimeLimit" and type(adapted.env).__name__ == "PlaygroundEnv", adapted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=8, total_steps=64, n_epochs=1, n_minibatches=2),
                             eval=EvalConfig(enabled=False))
        seen = []
        train_ppo(VnlShapedImitation(), "mlp", config, log_fn=lambda metrics, steps: seen.append(steps))
    assert seen and seen[-1] == 64


# ---------------------------------------------------------------------------- slow: compiled MJX


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rodent_imitation", "rodent_run"])
def test_check_env(name):
    from nnx_ppo.envs import make
    from nnx_ppo.testing import check_env

    kwargs = {"n_clips": 2, "clip_frames": 24, "max_start_frame": 10} if name == "rodent_imitation" else {}
    report = check_env(make(name, **kwargs), n_envs=4, n_steps=20)
    assert np.all(np.isfinite(report.reward))
    if name == "rodent_imitation":  # episodes of at most 18 steps: every env truncates or fails within 20
        assert report.done.sum(0).min() >= 1
