"""The virtual rodent body (dm-control's ``rodent.xml``) made MJX-compatible.

The XML is read from the installed ``dm_control`` package (found with
``importlib.util.find_spec``; dm_control's Python code is never imported)
and edited at load time. The edits and why:

* **Contacts.** Every geom gets ``contype = conaffinity = 0``; contacts come
  only from explicit ``<pair>``s between the floor plane and a few massless
  proxies: the two feet and the middle toes (capsules), the two hands and
  the torso, belly (pelvis) and skull (spheres at the ellipsoids' centres,
  radius the smallest semi-axis), and the middle fingers (capsules). MJX has
  no ellipsoid-box collision; with only plane-sphere and plane-capsule pairs
  it compiles two small collision functions. Paw pairs have ``condim 3``
  (friction), the body pairs ``condim 1`` (they only stop the body sinking).
  The proxies have ``density 0``, so masses and inertias are the original's.
* **Tail.** The original tail has 30 segments, 24 of them jointed and driven
  by two fixed tendons. MJX unrolls its kinematic-tree passes per tree depth
  and body kind, and the 38-deep tail chain made one vmapped ``mjx.step``
  compile in 15-20 minutes on a 2-core CPU (see docs/rodent.md). Only the
  first tail segment keeps its two joints; the two caudal tendons (and so
  the two caudal actuators) now act on that segment alone, and the other
  29 segments are rigid. All **38 actuators** stay; nq 52 with the free
  joint. Static bodies are fused into their parents (``fusestatic``, depth
  11); tracked bodies keep a site at their origin, so their positions
  survive the fusion.
* **Armature floor.** The distal joints (wrists, fingers, ankles, toes,
  elbows, ...) have an armature of 6e-7; under MJX's float32 arithmetic
  about a third of the envs diverged (NaN) within 50 steps of uniform
  random actions (float64 MuJoCo did not). Every hinge gets an armature of
  at least ``ARMATURE_FLOOR`` = 5e-5 (0 of 128 envs diverged; 2e-5 also
  gave 0 of 128, 1e-5 gave 1 of 128). This slows the lightest segments
  (fingers, toes) the most.
* **Dropped**: the skin (a rendering asset), the sensors (observations are
  computed from the state), the contact excludes (no self-contacts).
* **Added**: a free joint on the torso ("root"), a floor plane, a light.
* **Options**: CG solver, 4 iterations, 4 line-search iterations, pyramidal
  cone, Euler integration with implicit joint damping (MuJoCo's default:
  without it the small armatures make the joint damping unstable), and
  **sparse** Jacobians / mass matrix (MJX's own factorization). With dense
  ones MJX factorizes through jaxlib's batched LAPACK Cholesky, twice per
  step; on a 2-core CPU two of those kernels running at once waited on each
  other's thread pool for good (a hang at 64 envs, seen in two runs).
  Sparse costs ~10% in compile time and speed (docs/rodent.md).
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import xml.etree.ElementTree as ET

import mujoco
import numpy as np

__all__ = []

# bumped whenever an edit below changes the compiled model (reference clips are keyed on it)
BODY_VERSION = 3

# minimum joint armature (kg m^2): float32 MJX diverges with the original 6e-7 (module docstring)
ARMATURE_FLOOR = 5e-5

# bodies whose positions the imitation task tracks (each gets a site "track_<name>" at its origin)
TRACKED_BODIES = ("torso", "pelvis", "skull", "upper_arm_L", "upper_arm_R", "hand_L", "hand_R",
                  "upper_leg_L", "upper_leg_R", "foot_L", "foot_R")
END_EFFECTORS = ("hand_L", "hand_R", "foot_L", "foot_R", "skull")

_KEPT_TAIL_SEGMENT = "vertebra_C1"

# floor contacts: (geom to copy, proxy type, condim)
_PAW_PAIRS = (("foot_L_collision", "capsule"), ("foot_R_collision", "capsule"),
              ("toe_L1_collision", "capsule"), ("toe_R1_collision", "capsule"),
              ("hand_L_collision", "sphere"), ("hand_R_collision", "sphere"),
              ("finger_L1_collision", "capsule"), ("finger_R1_collision", "capsule"))
_BODY_PAIRS = (("collision_torso", "sphere"), ("collision_pelvis_gut", "sphere"), ("skull_0_collision", "sphere"))


def rodent_xml_path() -> pathlib.Path:
    """The path of ``rodent.xml`` inside the installed dm_control package.

    Raises:
      ImportError: dm_control is not installed (one line naming the extra).
    """
    spec = importlib.util.find_spec("dm_control")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError('the rodent tasks need dm_control\'s rodent.xml: pip install "nnx_ppo[rodent]"')
    for root in spec.submodule_search_locations:
        path = pathlib.Path(root, "locomotion", "walkers", "assets", "rodent.xml")
        if path.is_file():
            return path
    raise ImportError(f'dm_control ({spec.submodule_search_locations}) has no rodent.xml: '
                      'pip install "nnx_ppo[rodent]"')


def _edited_xml(path: pathlib.Path) -> str:
    """``rodent.xml`` without skin, sensors, contact excludes and the joints of
    tail segments 2-30; the caudal tendons act on segment 1 alone (XML text)."""
    root = ET.parse(path).getroot()
    for parent_tag, child_tag in (("asset", "skin"), ("sensor", None), ("contact", None)):
        for parent in root.findall(parent_tag):
            for child in list(parent):
                if child_tag is None or child.tag == child_tag:
                    parent.remove(child)
    removed = set()
    for body in root.iter("body"):
        if body.get("name", "").startswith("vertebra_C") and body.get("name") != _KEPT_TAIL_SEGMENT:
            for joint in body.findall("joint"):
                body.remove(joint)
                removed.add(joint.get("name"))
    for fixed in (f for tendons in root.findall("tendon") for f in tendons):
        for joint in fixed.findall("joint"):
            if joint.get("joint") in removed:
                fixed.remove(joint)
            elif joint.get("joint").startswith("vertebra_C"):
                joint.set("coef", "1.0")  # the kept segment carries the whole caudal tendon
    return ET.tostring(root, encoding="unicode")


def _add_proxy(spec: mujoco.MjSpec, geom_name: str, kind: str) -> str:
    """A massless, non-colliding copy of geom ``geom_name`` as a sphere or
    capsule (for an explicit floor pair); returns its name."""
    src = spec.geom(geom_name)
    size = np.asarray(src.size, float)
    body = src.parent
    proxy = body.add_geom(name=f"{geom_name}_floor", pos=src.pos, contype=0, conaffinity=0, density=0.0,
                          group=3, rgba=[0.8, 0.3, 0.3, 0.4])
    if src.alt.type != mujoco.mjtOrientation.mjORIENTATION_QUAT:
        proxy.alt = src.alt
    else:
        proxy.quat = src.quat
    if kind == "sphere":
        proxy.type = mujoco.mjtGeom.mjGEOM_SPHERE
        proxy.size = [float(size[:3].min() if src.type == mujoco.mjtGeom.mjGEOM_ELLIPSOID else size[0]), 0, 0]
    else:
        proxy.type = mujoco.mjtGeom.mjGEOM_CAPSULE
        proxy.size = [float(size[0]), float(size[1]), 0]
    return proxy.name


def build_spec(sim_dt: float = 0.002, solver: str = "cg", iterations: int = 4, ls_iterations: int = 4,
               body_contacts: bool = True) -> mujoco.MjSpec:
    """The edited rodent as an ``MjSpec`` (see the module docstring).

    Args:
      sim_dt: physics time step (s).
      solver: ``"cg"`` or ``"newton"``.
      iterations: solver iterations.
      ls_iterations: line-search iterations.
      body_contacts: also pair the floor with the torso, belly and skull.
    """
    spec = mujoco.MjSpec.from_string(_edited_xml(rodent_xml_path()))
    torso = spec.body("torso")
    for joint in spec.joints:
        joint.armature = max(float(joint.armature), ARMATURE_FLOOR)
    torso.add_freejoint(name="root")
    for name in TRACKED_BODIES:
        spec.body(name).add_site(name=f"track_{name}", size=[0.002, 0, 0], group=4)
    for geom in spec.geoms:
        geom.contype = geom.conaffinity = 0
    world = spec.worldbody
    world.add_geom(name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05], rgba=[0.4, 0.45, 0.5, 1],
                   contype=0, conaffinity=0)
    world.add_light(name="sun", pos=[0, 0, 2], dir=[0, 0, -1], type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL)
    pairs = [(g, k, 3) for g, k in _PAW_PAIRS] + ([(g, k, 1) for g, k in _BODY_PAIRS] if body_contacts else [])
    for geom_name, kind, condim in pairs:
        proxy = _add_proxy(spec, geom_name, kind)
        spec.add_pair(name=f"floor_{proxy}", geomname1="floor", geomname2=proxy, condim=condim,
                      friction=[1.0, 1.0, 0.005, 0.0001, 0.0001])
    opt = spec.option
    opt.timestep = sim_dt
    opt.solver = {"cg": mujoco.mjtSolver.mjSOL_CG, "newton": mujoco.mjtSolver.mjSOL_NEWTON}[solver]
    opt.iterations = iterations
    opt.ls_iterations = ls_iterations
    opt.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
    opt.jacobian = mujoco.mjtJacobian.mjJAC_SPARSE  # no LAPACK Cholesky (module docstring)
    spec.compiler.fusestatic = True
    return spec


@functools.lru_cache(maxsize=8)
def load_model(sim_dt: float = 0.002, solver: str = "cg", iterations: int = 4, ls_iterations: int = 4,
               body_contacts: bool = True) -> mujoco.MjModel:
    """The compiled edited rodent (cached per argument set; treat it as read-only)."""
    model = build_spec(sim_dt, solver, iterations, ls_iterations, body_contacts).compile()
    model.vis.global_.offwidth = max(model.vis.global_.offwidth, 1280)
    model.vis.global_.offheight = max(model.vis.global_.offheight, 720)
    return model


def body_site_ids(model: mujoco.MjModel, names=TRACKED_BODIES) -> np.ndarray:
    """Site ids ``[len(names)]`` of the tracking sites of ``names``."""
    return np.array([mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, f"track_{n}") for n in names], np.int32)
