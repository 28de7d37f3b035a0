"""``nnx-ppo envs``: the built-in tasks, the env sources, the presets and the
library defaults of each kind of network."""

from __future__ import annotations

__all__ = ["env_spec_forms", "run_envs"]


def env_spec_forms() -> str:
    """The forms an env spec takes, from the registry's table of sources."""
    from nnx_ppo.envs.registry import list_sources

    return ", ".join(["NAME (a built-in task)", *(f"{s.prefix}:NAME" for s in list_sources())])


def run_envs() -> int:
    from nnx_ppo.envs.registry import list_envs, list_sources
    from nnx_ppo.presets import NETWORK_DEFAULTS, PRESETS

    print("built-in tasks:")
    for spec in list_envs():
        if ":" not in spec:
            print(f"  {spec}")
    print("\nenv sources: PREFIX:NAME builds the source's env NAME (if its package is installed; "
          "nnx_ppo.envs.register_source adds sources):")
    sources = list_sources()
    width = max((len(s.prefix) for s in sources), default=0) + 2
    for source in sources:
        print(f"  {source.prefix + ':':<{width}} {source.description}".rstrip())
        if source.examples:
            print(f"  {'':<{width}} e.g. {' '.join(source.examples)}")
    print("\ntuned presets (`nnx-ppo train ENV [--network KIND]` starts from them; nnx_ppo.presets in Python):")
    for p in PRESETS:
        ppo = p.config.ppo
        target = "-" if p.target is None else f"{p.target:g}"
        print(f"  {p.env:<28} {p.network:<5} {ppo.total_steps:>9,} steps  target {target}  {p.description}")
    print("\nother envs (and --no-preset) start from the library defaults (docs/training.md); "
          "where a kind of network has its own:")
    for network, own in NETWORK_DEFAULTS.items():
        print(f"  {network}: {', '.join(f'{k} {v}' for part in own.values() for k, v in part.items())}")
    return 0
