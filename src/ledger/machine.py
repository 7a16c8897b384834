"""The campaign state machine, built from the database's own transition rows.

There is no second copy of the rules in Python: ``StateMachine.load`` reads the
``states`` and ``transitions`` views and builds a ``transitions`` machine from
them, which then answers "may this happen from here?" and draws the diagram
(mermaid always; SVG with graphviz when it is installed, else a built-in
drawing).
"""

from __future__ import annotations

import html
import shutil
from collections.abc import Iterable
from typing import Any, Literal

from transitions import Machine
from transitions.extensions import GraphMachine

from ledger.db.models import StateRow, TransitionRow
from ledger.db.reads import Reads

#: Campaigns are created by ``open`` straight into this state.
INITIAL = "ready"


class StateMachine:
    """States and transitions as the database defines them."""

    def __init__(self, states: Iterable[StateRow], transitions: Iterable[TransitionRow]):
        self.states = sorted(states, key=lambda s: s.position)
        self.transitions = list(transitions)
        self.terminal = {s.name for s in self.states if s.is_terminal}
        self._machine = self._build()

    @classmethod
    async def load(cls, reads: Reads) -> StateMachine:
        """Read the machine from the database."""
        return cls(await reads.states(), await reads.transitions())

    def _build(self) -> Machine:
        return Machine(
            model=None,
            states=[{"name": s.name, "final": s.is_terminal} for s in self.states],
            # ``open`` creates the row; it has no source state to move from.
            transitions=[{"trigger": t.name, "source": t.from_state, "dest": t.to_state}
                         for t in self.transitions if t.from_state is not None],
            initial=INITIAL,
            auto_transitions=False,
        )

    def next_state(self, transition: str, state: str) -> str | None:
        """Where ``transition`` leads from ``state``, or ``None`` if it is illegal there."""
        for event_transition in self._machine.get_transitions(trigger=transition, source=state):
            return event_transition.dest
        return None

    def allowed(self, state: str) -> list[str]:
        """The transitions legal from ``state``."""
        return sorted(self._machine.get_triggers(state))

    def _graph(self, engine: Literal["graphviz", "mermaid"]) -> Any:
        """The diagram of the rows, drawn by ``transitions`` with ``engine``."""
        class _Model:
            pass

        model = _Model()
        GraphMachine(
            model=model,
            states=[s.name for s in self.states],
            transitions=[{"trigger": t.name, "source": t.from_state, "dest": t.to_state}
                         for t in self.transitions if t.from_state is not None],
            initial=INITIAL, auto_transitions=False, graph_engine=engine,
            title="Ledger campaign states",
        )
        return getattr(model, "get_graph")()  # added to the model by GraphMachine

    def mermaid(self) -> str:
        """A mermaid ``stateDiagram-v2`` drawn by ``transitions`` from the rows."""
        text = self._graph("mermaid").draw(None)
        lines = [line for line in text.splitlines()
                 if "classDef" not in line and not line.strip().startswith("Class ")]
        lines += [f"  {name} --> [*]" for name in sorted(self.terminal)]
        return "\n".join(lines).rstrip() + "\n"

    def svg(self) -> str:
        """The diagram as SVG: graphviz when its ``dot`` is installed, else a
        built-in arc diagram (states on a line, forward moves above, backward
        moves below)."""
        if shutil.which("dot"):
            try:
                return self._graphviz_svg()
            except ImportError:
                pass
        return self._arc_svg()

    def _graphviz_svg(self) -> str:
        drawn: bytes = self._graph("graphviz").draw(None, format="svg", prog="dot")
        return drawn.decode()

    def _arc_svg(self) -> str:
        gap, top, radius = 130, 250, 34
        xs = {s.name: 70 + i * gap for i, s in enumerate(self.states)}
        width = 70 * 2 + gap * (len(self.states) - 1) + 60  # room for the last label
        moves = [t for t in self.transitions if t.from_state is not None]
        sources: dict[str, set[str]] = {}
        for t in moves:
            sources.setdefault(t.name, set()).add(t.from_state)  # type: ignore[arg-type]
        labels: dict[tuple[str, str], list[str]] = {}
        for t in moves:
            labels.setdefault((t.from_state, t.to_state), []).append(t.name)  # type: ignore[arg-type]
        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top * 2}" '
            f'viewBox="0 0 {width} {top * 2}" font-family="sans-serif" font-size="12">',
            "<title>Ledger campaign states</title>",
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>',
            f'<text x="{xs[INITIAL]}" y="{top - radius - 40}" text-anchor="middle">open</text>',
            f'<line x1="{xs[INITIAL]}" y1="{top - radius - 34}" x2="{xs[INITIAL]}" '
            f'y2="{top - radius - 2}" stroke="black" marker-end="url(#arrow)"/>',
        ]
        for (src, dst), names in labels.items():
            x1, x2 = xs[src], xs[dst]
            forward = x2 > x1
            lift = min(30 + abs(x2 - x1) * 0.3, top - radius - 30)
            y = top - radius if forward else top + radius
            cy = y - lift if forward else y + lift
            parts.append(f'<path d="M{x1},{y} Q{(x1 + x2) / 2},{cy} {x2},{y}" fill="none" '
                         f'stroke="{"#333" if forward else "#a33"}" marker-end="url(#arrow)"/>')
            # A transition from many states is labelled once, at its destination.
            own = sorted(n for n in set(names) if len(sources[n]) == 1)
            if own:
                at = 0.5 if forward else 0.3  # back edges: label near the source
                lx = (1 - at) ** 2 * x1 + 2 * (1 - at) * at * (x1 + x2) / 2 + at * at * x2
                ly = (1 - at) ** 2 * y + 2 * (1 - at) * at * cy + at * at * y
                parts.append(f'<text x="{lx:.0f}" y="{ly + (-5 if forward else 14):.0f}" '
                             f'text-anchor="middle">{html.escape(", ".join(own))}</text>')
        for name, froms in sorted(sources.items()):
            if len(froms) > 1:
                dst = next(t.to_state for t in moves if t.name == name)
                parts.append(f'<text x="{xs[dst]}" y="{top - radius - 10}" text-anchor="middle">'
                             f'{html.escape(name)} (from {len(froms)} states)</text>')
        for s in self.states:
            fill = "#e8e8e8" if s.is_terminal else "#ffffff"
            width_stroke = 3 if s.is_terminal else 1.5
            parts.append(f'<circle cx="{xs[s.name]}" cy="{top}" r="{radius}" fill="{fill}" '
                         f'stroke="black" stroke-width="{width_stroke}"><title>'
                         f'{html.escape(s.description)}</title></circle>')
            parts.append(f'<text x="{xs[s.name]}" y="{top + 4}" text-anchor="middle">'
                         f'{html.escape(s.name)}</text>')
        parts.append("</svg>")
        return "\n".join(parts) + "\n"
