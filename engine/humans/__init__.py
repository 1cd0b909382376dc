"""The engine's side of humans in the loop: the desk that asks and holds (DESIGN §7), the
confidence assessor that asks for help (seed 004), the blocker ledger (seed 003), the
approvals of agents' tool calls. Each
returns decisions (a Next to fire) rather than raising."""
from .approvals import Approvals
from .blockers import BlockerLedger
from .desk import HumanDesk
from .fallback import Assessor
from .run_questions import RunQuestions

__all__ = ["Approvals", "Assessor", "BlockerLedger", "HumanDesk", "RunQuestions"]
