"""What becomes of the knowledge a Librarian staged: promoted into the docs dir, kept
staged, or carried into the next iteration. The decision, recorded in the iteration's
metadata, is the commit point; the files move through the store's knowledge verbs."""
from __future__ import annotations

import os

from ralph.session_store import State


class KnowledgeKeeper:
    def __init__(self, session, tracker, settings, *, state, outside_allowed: bool = False):
        self.session = session
        self.tracker = tracker
        self.settings = settings    # knowledge config: approval, timeout_seconds, docs_dir
        self._state = state
        self._outside_allowed = outside_allowed   # the human's own config said so

    def promote(self, why: str, by: str | None = None) -> None:
        it, _meta = self.tracker.iteration()
        refused = it.knowledge.promote(
            os.path.join(self.session.workspace, self.settings.docs_dir), self.session.workspace,
            record={"session": self.session.id, "iteration": it.number, "why": why,
                    "at": self.tracker.clock.now().isoformat()},
            outside_allowed=self._outside_allowed)
        if refused:   # a link planted in the docs dir's place: kept staged, and said
            self.session.append_event("knowledge.refused", {"why": refused})
            self._decide("skipped", by)
            return
        self._decide("promoted", by)

    def keep(self, by: str | None = None) -> None:
        self._decide("skipped", by)

    def carry(self) -> None:
        it, _meta = self.tracker.iteration()
        it.knowledge.carry_to(self.session.iteration(it.number + 1).knowledge,
                              carried_from=it.number, now=self.tracker.clock.now())
        self._decide("carried")

    def decide_by_signal(self, signal) -> str:
        """APPROVE or SKIP, taken from the mailbox: what it did, for handling_metadata."""
        _it, meta = self.tracker.iteration()
        # not the store's `once`: who decided is written with the decision, in the one
        # atomic rewrite of the iteration's metadata that is its commit point (views read it)
        if meta.knowledge_decided_by == signal.name:
            # it decided, then a crash came before it was marked: say what it did
            return self._action(meta)
        if self._state() is not State.KNOWLEDGE_APPROVAL or meta.knowledge_decision is not None:
            return "no effect: the knowledge of this iteration was decided already"
        if signal.type == "APPROVE":
            self.promote(f"APPROVE signal: {signal.message}".rstrip(": "), by=signal.name)
        else:
            self.keep(by=signal.name)
        return self._action(meta)

    def _decide(self, decision: str, by: str | None = None) -> None:
        """The commit point; `by` names the APPROVE/SKIP signal that decided, if one did."""
        self.tracker.record_knowledge_decision(decision, by)

    @staticmethod
    def _action(meta) -> str:
        if meta.knowledge_decision == "promoted":
            return f"promoted the staged knowledge of iteration {meta.iteration}"
        return f"kept the knowledge of iteration {meta.iteration} staged"
