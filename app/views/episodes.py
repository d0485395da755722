"""Episodes as HTML (agent demo, replay): turns, the experience shown, the step-through player, and the page's CSS."""
from __future__ import annotations

import html
from typing import Any, Sequence


def _pre(text: str) -> str:
    return f"<pre class='comprl-obs'>{html.escape(text)}</pre>"


def turn_html(turn: dict[str, Any]) -> str:
    """One turn of a live episode: the action taken (if any), then what the agent saw."""
    parts = [f"<div class='comprl-turn'><div class='turn-head'>turn {turn.get('turn', 0)}"]
    if turn.get("action"):
        parts.append(f" · action <code>{html.escape(str(turn['action']))}</code> · reward {float(turn.get('reward', 0.0)):+.2f}")
    if turn.get("done"):
        ok = turn.get("success")
        parts.append(f" · <b>episode over: {'success' if ok else 'failure' if ok is not None else 'ended'}</b>")
    parts.append("</div>")
    if turn.get("tool_query"):
        parts.append(f"<div class='tool'>search-and-ask: <i>{html.escape(turn['tool_query'])}</i><br>"
                     f"answer: {html.escape(turn.get('tool_answer', ''))}</div>")
    parts.append(_pre(str(turn.get("observation", ""))))
    parts.append("</div>")
    return "".join(parts)


def experience_html(text: str, note: str = "") -> str:
    if not text:
        return "<div class='comprl-exp'><em>no experience shown</em></div>"
    return (f"<div class='comprl-exp'><div class='turn-head'>experience shown{' · ' + html.escape(note) if note else ''}</div>"
            f"{_pre(text)}</div>")


def stepper_html(turns: Sequence[dict[str, Any]], at: int | None = None, dom_id: str = "ep") -> str:
    """Turn-by-turn, oldest first, one turn at a time with a step slider (a 50-turn episode is one screen, not a
    7,400-px page). The turns are all in the page; the slider shows one (no round trip). `at`: the turn shown first
    (default: the last)."""
    if not turns:
        return ""
    n = len(turns)
    at = n - 1 if at is None else max(0, min(n - 1, at))
    sid = html.escape(dom_id)
    # Gradio's HTML component drops <script>: the slider works through an inline handler.
    on = ("const r=this.closest('.comprl-stepper');const v=+this.value;"
          "r.querySelectorAll('.comprl-step').forEach((e,i)=>{e.style.display=i===v?'block':'none'});"
          "r.querySelector('.comprl-step-label').textContent='turn '+v+' of '+(r.querySelectorAll('.comprl-step').length-1);")
    parts = [f"<div class='comprl-stepper' id='{sid}-stepper'>",
             f"<div class='comprl-step-controls'><input type='range' class='comprl-step-slider' id='{sid}-slider' min='0' "
             f"max='{n - 1}' step='1' value='{at}' oninput=\"{on}\" onchange=\"{on}\">"
             f"<span class='comprl-step-label'>turn {at} of {n - 1}</span></div>"]
    for i, t in enumerate(turns):
        parts.append(f"<div class='comprl-step' data-turn='{i}' style='display:{'block' if i == at else 'none'}'>"
                     f"{turn_html(t)}</div>")
    parts.append("</div>")
    return "".join(parts)


# The step slider of an episode view, wired once per gr.HTML (js_on_load): Gradio may drop inline handlers, and the
# component's content is replaced on every update while its element stays.
STEPPER_JS = """
const show = (slider) => {
  const root = slider.closest('.comprl-stepper'); if (!root) return;
  const steps = root.querySelectorAll('.comprl-step'); const v = +slider.value;
  steps.forEach((e, i) => { e.style.display = i === v ? 'block' : 'none'; });
  const label = root.querySelector('.comprl-step-label');
  if (label) label.textContent = 'turn ' + v + ' of ' + (steps.length - 1);
};
element.addEventListener('input', (ev) => { if (ev.target.classList && ev.target.classList.contains('comprl-step-slider')) show(ev.target); });
element.addEventListener('change', (ev) => { if (ev.target.classList && ev.target.classList.contains('comprl-step-slider')) show(ev.target); });
"""


def live_episode_html(turns: Sequence[dict[str, Any]], experience: str = "", note: str = "") -> str:
    """The episode so far: the experience block the agent was given, then a step slider over the turns, oldest
    first, showing the newest (each new turn moves the slider to it)."""
    if not turns:
        return "<em>press Start to begin an episode</em>"
    return experience_html(experience, note) + stepper_html(turns, dom_id="live")


def trajectory_html(traj: dict[str, Any]) -> str:
    """A stored episode (trajectories row with its steps) for replay, in order."""
    head = (f"<div class='turn-head'>episode #{traj['id']} · {html.escape(traj['env'])} · seed {traj['seed']} · "
            f"{'with' if traj['with_experience'] else 'without'} experience · "
            f"<b>{'success' if traj['success'] else 'failure'}</b> · reward {traj['reward']:+.2f} · "
            f"{traj['num_actions']} actions</div><div>task: {html.escape(traj['task'])}</div>")
    body = [head, experience_html(traj.get("experience_text", ""),
                                  ", ".join(f"#{i}" for i in traj.get("experience_ids", [])))]
    turns = [{"turn": n, "observation": st.get("observation", ""), "action": st.get("action", ""),
              "reward": st.get("reward", 0.0), "tool_query": st.get("tool_query", ""), "tool_answer": st.get("tool_answer", ""),
              "done": n == len(traj["steps"]), "success": traj["success"]} for n, st in enumerate(traj.get("steps", []), start=1)]
    body.append(stepper_html(turns, at=0, dom_id=f"episode-{traj['id']}"))
    return "".join(body)


CSS = """
.comprl-diff{font-family:monospace;font-size:12px;white-space:pre-wrap;background:#fafafa;padding:6px;border-radius:4px}
.comprl-diff .d-add{color:#116329;background:#dafbe1;display:block}
.comprl-diff .d-del{color:#82071e;background:#ffebe9;display:block}
.comprl-diff .d-hunk{color:#0550ae;display:block}
.comprl-diff .d-ctx{display:block}
.comprl-obs{font-family:monospace;font-size:12px;line-height:1.15;background:#f6f8fa;padding:6px;border-radius:4px;
  white-space:pre;overflow-x:auto}
.comprl-turn{border-left:3px solid #1f77b4;padding-left:8px;margin:6px 0}
.comprl-exp{border-left:3px solid #ff7f0e;padding-left:8px;margin:6px 0}
.turn-head{font-size:13px;color:#444;margin-bottom:2px}
.comprl-turn .tool{font-size:12px;background:#fff7e6;padding:4px}
.comprl-progress{position:relative;height:22px;background:#eee;border-radius:4px;overflow:hidden}
.comprl-progress .bar{position:absolute;left:0;top:0;bottom:0;background:#8fd18f}
.comprl-progress span{position:relative;padding-left:8px;font-size:13px;line-height:22px}
.comprl-error{color:#b00020}
.comprl-build{margin:4px 0 8px 0}
.comprl-build.done .comprl-progress .bar{background:#b9e4b9}
.comprl-build.failed .comprl-progress .bar{background:#f3b3b3}
.comprl-step-controls{display:flex;align-items:center;gap:10px;margin:4px 0}
.comprl-step-slider{flex:1}
.comprl-step-label{font-size:13px;color:#444;min-width:110px}
#runs-table td{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#runs-table th .header.text,#library-table th .header.text,#search-table th .header.text{white-space:normal;
  word-break:keep-all;overflow-wrap:normal;text-overflow:clip;hyphens:none}
#library-table th .header.text,#search-table th .header.text,#library-table td .cell-wrap,#search-table td .cell-wrap{font-size:13px}
"""
