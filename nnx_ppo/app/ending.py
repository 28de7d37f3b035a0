"""How every command that trains ends: training into an open
:class:`~nnx_ppo.runner.Run`, with each way it can end turned into an exit
code and one line, the run directory intact (``train``, ``--seeds``,
``distill``, ``sweep`` and ``resume`` alike).

=====  ==================================================================
code   how training ended
=====  ==================================================================
0      done, or stopped early by Ctrl-C / SIGTERM (a checkpoint is saved)
1      failed: non-finite values, a replay mismatch, an env, checkpoint or disk error
130    aborted by a second Ctrl-C (the last checkpoint is kept)
=====  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nnx_ppo import run_dir as rd
from nnx_ppo.app.commands import CliError, print_error
from nnx_ppo.progress import StopFlag, pretty_path
from nnx_ppo.runner import Run

__all__ = ["train_into"]


def train_into(run: Run, train: Callable[[StopFlag], Any]) -> tuple[int, Any, bool]:
    """``train(stop)`` into ``run`` (``stop()`` turns True after a Ctrl-C or
    SIGTERM): ``(exit code, its result or None, whether a stop was
    asked)``; ``run`` is closed (its directory released) in every case. A
    usage error (:class:`~nnx_ppo.app.commands.CliError`) passes through, and
    a bad row of a resumed run's metrics.jsonl becomes one (before training)."""
    from nnx_ppo.algorithms.distributed import await_lost_peer, process_count
    from nnx_ppo.algorithms.driver import NonFiniteError
    from nnx_ppo.algorithms.footprint import FootprintError

    stop = StopFlag(run.write)
    code, result = 0, None
    try:
        with stop:
            result = train(stop)
    except KeyboardInterrupt:
        run.close()
        where = f" is in {pretty_path(run.path / rd.CHECKPOINT_DIR)}" if run.path is not None else " is kept"
        print_error(f"aborted; metrics so far are kept, and the last saved checkpoint (if any){where}")
        code = 130
    except (rd.MetricsError, FootprintError) as e:  # a bad metrics row of a resumed run, a config too large for
        run.close()                                   # the memory: refused before training
        raise CliError(str(e)) from None
    except NonFiniteError as e:
        run.close()
        print_error(str(e))
        code = 1
    except (ValueError, OSError, RuntimeError) as e:  # env checks, checkpoints, shapes, the disk
        run.close()
        if process_count() > 1:  # a collective that failed because a peer is gone: the watch names the peer
            await_lost_peer(e)
        print_error(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        code = 1
    finally:
        run.close()
    return code, result, stop.requested
