"""What every launcher whose ranks connect back from other machines does alike (Ray's
``ray.launch.RayLauncher``, SLURM's ``slurm.launcher.SlurmLauncher``): the job shipped as one
cloudpickled payload (the job and the notebook's context, pickled once per job, so that a function
that does not pickle fails before the run shows), no channels opened ahead (each rank's channels are
the connections it makes back), and the accept tail: every rank's four streams accepted on the
listener (``channels.sockets``) within the rendezvous timeout, handed on as the run's channels, and
the listener closed. Each engine's own part is how it places and starts its ranks."""
from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Callable

from ...channels.sockets import SocketPipes, StreamListener
from ...rank.spawn_context import capture_context, pickle_job
from ..base import Launcher, StartFailed

if TYPE_CHECKING:
    from ...channels import RankPipes
    from ...wire.plan import LaunchPlan
    from ...rank.runner import Job


class ConnectBackLauncher(Launcher):
    """The shared part of a connect-back engine's launcher (see the module). A subclass sets
    ``rendezvous_timeout`` and says who reaches the notebook (``peers``: "the cluster")."""

    peers = "the nodes"          # who connects back: said when the connections do not come
    rendezvous_timeout: float
    _shipped: tuple[Job, bytes] | None = None
    _listener: StreamListener | None = None
    _handed: list[SocketPipes] = []

    def prepare_parent(self) -> None:
        import cloudpickle  # noqa: F401  (ships the job; imported before the panel starts)

    def payload_for(self, job: Job) -> bytes:
        """The job and the notebook's context as the ranks load them (pickled once per job; a
        caller asks before the run starts, so a function that does not pickle fails first)."""
        if self._shipped is None or self._shipped[0] is not job:
            self._shipped = (job, pickle.dumps({"context": capture_context(), "job": pickle_job(job)},
                                               protocol=pickle.HIGHEST_PROTOCOL))
        return self._shipped[1]

    def open_channels(self, plan: LaunchPlan) -> list[RankPipes]:
        return []   # each rank's channels are the connections it makes back, accepted in start()

    def accept(self, listener: StreamListener, deadline: float, check: Callable[[], None], host: str,
               channels: list[RankPipes]) -> list[SocketPipes]:
        """Every rank's connections, by global rank, until ``deadline`` (``check`` runs while they
        come: a rank that ended first fails the start); they go into ``channels`` and the listener
        closes (nothing more comes)."""
        try:
            pipes = listener.accept_all(deadline, check)
        except TimeoutError as exc:
            raise StartFailed(
                f"{exc} within rdzv_timeout={self.rendezvous_timeout:g} s; a firewall between {self.peers} and "
                f"the notebook ({host}) blocks it, or the nodes reach the notebook through another address"
            ) from None
        self._handed = pipes
        listener.close(keep=pipes)
        self._listener = None
        channels.extend(pipes)
        return pipes

    def close_listener(self) -> None:
        """The listener closed, with any connection not handed on (a start that failed)."""
        try:
            if self._listener is not None:
                self._listener.close(keep=self._handed)
        finally:
            self._listener = None
