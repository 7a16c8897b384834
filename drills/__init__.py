"""Fault-injection drills, one scenario per module (``ledger drill list``).

Each drill sets up a throwaway database, starts real ``ledger`` processes,
injects one fault with real signals (SIGKILL, SIGSTOP, SIGTERM), backend
terminations or a server restart, and checks what must hold.
"""

from .approval import Approval
from .bad_patch import BadPatch
from .chaos import Chaos
from .database_restart import DatabaseRestart
from .dispatcher_crash import DispatcherCrash
from .drain import Drain
from .failover import Failover
from .forbidden_write import ForbiddenWrite
from .frozen_worker import FrozenWorker
from .gaming_agent import GamingAgent
from .heartbeat_race import HeartbeatRace
from .hostile import HostileAgent
from .intake import Intake
from .kill_worker import KillWorker
from .limits import Limits
from .load import Load
from .lost_doorbell import LostDoorbell
from .machines import Machines
from .merge_queue import MergeQueue
from .partition import Partition
from .patroni import Patroni
from .second_attempt_differs import SecondAttemptDiffers
from .stop_mid_attempt import StopMidAttempt
from .upgrade import Upgrade
from .verifier_crash import VerifierCrash
from .zombie_worker import ZombieWorker

#: In the order `ledger drill all` runs them (the issue's numbering).
ALL = [Intake(), SecondAttemptDiffers(), KillWorker(), ZombieWorker(), FrozenWorker(), HeartbeatRace(), BadPatch(),
       ForbiddenWrite(), LostDoorbell(), DatabaseRestart(), DispatcherCrash(), StopMidAttempt(),
       Drain(), VerifierCrash(), Partition(), GamingAgent(), HostileAgent(), Load(), Failover(), Patroni(),
       Machines(), MergeQueue(), Approval(), Limits(), Chaos(), Upgrade()]
