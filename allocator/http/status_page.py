"""The read-only status page every node serves at ``/`` of its admin address (docs/design.md §7).

One self-contained HTML document served with :data:`HEADERS`; it only reads this node's
``status`` and ``cluster`` JSON and renders it.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Final

CONTENT_TYPE: Final = "text/html; charset=utf-8"

_STYLE = """
:root { color-scheme: light dark; --muted: #777; --bad: #c0392b; --good: #1e8449; }
body { font: 15px/1.4 system-ui, sans-serif; margin: 1.5rem auto; max-width: 62rem;
       padding: 0 1rem; }
h1 { font-size: 1.3rem; margin: 0 0 .2rem; }
h2 { font-size: 1rem; margin: 1.4rem 0 .4rem; text-transform: uppercase;
     letter-spacing: .05em; color: var(--muted); }
.sub, .muted { color: var(--muted); }
.big { font-size: 1.8rem; font-weight: 600; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(11rem, 1fr));
        gap: .6rem 1.2rem; }
.grid div span { display: block; color: var(--muted); font-size: .8rem; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .25rem .6rem .25rem 0; border-bottom: 1px solid #8884;
         vertical-align: top; }
th { font-weight: 600; font-size: .8rem; color: var(--muted); }
.bad { color: var(--bad); font-weight: 600; }
.good { color: var(--good); }
.banner { border: 1px solid var(--bad); color: var(--bad); padding: .5rem .8rem;
          margin: .8rem 0; border-radius: 4px; }
"""

# Reads this node's ``status`` and ``cluster`` JSON once a second by relative URLs (so the page
# also works behind a proxy under a prefix) and renders values as text (``textContent``), never
# as markup, so whatever a znode or a host name holds cannot inject anything. Read-only: no
# form, no button, nothing that POSTs.
_SCRIPT = """
"use strict";
const REFRESH_MS = 1000;
const STALE_S = 5;  // a cluster view older than this is flagged
const $ = (id) => document.getElementById(id);
const dash = "\\u2014";

function show(id, value) { $(id).textContent = value == null || value === "" ? dash : value; }

function span(seconds) {
  if (seconds == null || !isFinite(seconds)) return dash;
  let s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + " s";
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d) return d + " d " + h + " h";
  if (h) return h + " h " + m + " min";
  return m + " min " + s + " s";
}

function number(value) { return value == null ? dash : Number(value).toLocaleString("en-US"); }

function when(iso) {
  return iso ? iso.replace("T", " ").replace(/\\.\\d+/, "").replace(/\\+00:00$/, " UTC") : dash;
}

function yesNo(value) { return value == null ? "unknown" : value ? "yes" : "no"; }

function fill(id, rows) {
  const body = $(id);
  body.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      const [value, cls] = Array.isArray(cell) ? cell : [cell, ""];
      td.textContent = value == null || value === "" ? dash : String(value);
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    return tr;
  }));
}

function flag(value) { return value === false ? ["no", "bad"] : [yesNo(value), ""]; }

function render(node, cluster) {
  const now = cluster.now;
  show("node-name", node.name);
  show("node-role", node.role);
  show("node-since", span(now - node.since) + " as " + node.role);
  show("node-session", node.session);
  show("node-db", yesNo(node.database_reachable));
  const offset = node.clock_offset_ms;
  show("node-clock", offset == null ? null
       : Math.round(offset) + " ms" + (node.clock_agrees === false ? " (disagrees)" : ""));
  const leader = cluster.leader;
  show("leader-name", leader ? leader.name : "no leader");
  $("leader-name").className = "big" + (leader ? "" : " bad");
  show("leader-host", leader ? leader.host + " (pid " + leader.pid + ")" : null);
  show("leader-since", leader && leader.since
       ? when(leader.since) + " (" + span(now - Date.parse(leader.since) / 1000) + ")" : null);
  show("leader-token", leader && leader.epoch != null
       ? "generation " + leader.generation + ", epoch " + leader.epoch : null);
  document.title = "allocator \\u2014 " + (leader ? leader.name + " leads" : "no leader");
  const pool = cluster.pool;
  show("pool-blocks", pool ? number(pool.available_blocks) : null);
  show("pool-ids", pool ? number(pool.available_ids) : null);
  show("pool-rate", pool && pool.claim_rate_blocks_per_s != null
       ? number(Math.round(pool.claim_rate_blocks_per_s * 10) / 10) + " blocks/s" : null);
  show("pool-runway", pool
       ? (pool.runway_s == null ? "no claims measured" : span(pool.runway_s)) : null);
  show("pool-mark", pool ? number(pool.high_water_id) : null);
  show("pool-claims", pool ? (pool.claims_paused ? "PAUSED (AL004)" : "served") : null);
  $("pool-claims").className = pool && pool.claims_paused ? "bad" : "";
  const bound = cluster.block_age;
  const oldest = bound ? bound.oldest_unclaimed_age_s : null;
  const past = bound && oldest != null && bound.max_block_age_s != null
       && oldest > bound.max_block_age_s;
  show("age-oldest", bound ? (oldest == null ? "pool empty" : span(oldest)
       + (past ? " (past the bound)" : "")) : null);
  $("age-oldest").className = past ? "bad" : "";
  show("age-bound", bound && bound.max_block_age_s != null ? span(bound.max_block_age_s) : null);
  show("age-serving", bound ? (bound.leader_serves ? "a leader serves"
       : bound.serve_aged_without_leader === false ? "no leader: aged blocks refused"
       : "no leader: older blocks handed out") : null);
  $("age-serving").className = bound && !bound.leader_serves ? "bad" : "";
  fill("queue", cluster.contenders.map((c, i) => [
    i > 0 ? "#" + (i + 1) : c.blocked ? ["blocked: " + c.blocked, "bad"] : ["leads", "good"],
    c.name, c.host, c.pid,
    flag(c.db_ok), flag(c.clock_ok), c.problem ? [c.problem, "bad"] : "",
  ]));
  show("queue-count", "(" + cluster.contenders.length + ")");
  fill("handovers", cluster.handovers.map((t) => [
    t.holder, when(t.elected_at), t.ended_at ? when(t.ended_at) : ["leading", "good"],
    t.ended_at ? span((Date.parse(t.ended_at) - Date.parse(t.elected_at)) / 1000) : "",
    t.end_reason || "", t.generation + " / " + t.epoch,
  ]));
  const warnings = [...cluster.problems];
  const age = cluster.age_s;
  if (age == null) warnings.push("no view of the cluster yet");
  else if (age > STALE_S) warnings.push("cluster view is " + span(age) + " old");
  if (node.handover_withheld) warnings.push("handover withheld: " + node.handover_withheld);
  if (node.fence_ahead_of_zookeeper) {
    warnings.push("fence ahead of ZooKeeper: an operator runs `allocator fence rebase`");
  }
  if (node.blocked) {
    warnings.push("blocked: " + node.blocked.reason + " (" + node.blocked.detail + ")");
  }
  if (node.database_behind_zookeeper) {
    warnings.push("database behind ZooKeeper: " + node.database_behind_zookeeper.reason);
  }
  $("warnings").hidden = warnings.length === 0;
  $("warnings").textContent = warnings.join("; ");
  show("updated", new Date().toLocaleTimeString());
}

async function json(path) {
  const answer = await fetch(path, { cache: "no-store" });
  if (!answer.ok) throw new Error(path + ": HTTP " + answer.status);
  return answer.json();
}

async function tick() {
  try {
    const [node, cluster] = await Promise.all([json("status"), json("cluster")]);
    render(node, cluster);
    $("unreachable").hidden = true;
  } catch (error) {
    $("unreachable").textContent =
      "This node does not answer (" + error.message + "); showing what it said last.";
    $("unreachable").hidden = false;
  } finally {
    setTimeout(tick, REFRESH_MS);
  }
}

tick();
"""

_BODY = """
<header>
  <h1>allocator <span class="muted">status</span></h1>
  <div class="sub">node <b id="node-name">&#8212;</b> &middot;
    <span id="node-role">&#8212;</span> &middot; updated <span id="updated">never</span>
    &middot; read-only, refreshes every second</div>
</header>
<div id="unreachable" class="banner" hidden></div>
<div id="warnings" class="banner" hidden></div>

<h2>Leader</h2>
<div class="grid">
  <div><span>leads</span><div id="leader-name" class="big">&#8212;</div></div>
  <div><span>since</span><div id="leader-since">&#8212;</div></div>
  <div><span>host</span><div id="leader-host">&#8212;</div></div>
  <div><span>fencing token</span><div id="leader-token">&#8212;</div></div>
</div>

<h2>Pool</h2>
<div class="grid">
  <div><span>blocks ready</span><div id="pool-blocks">&#8212;</div></div>
  <div><span>IDs ready</span><div id="pool-ids">&#8212;</div></div>
  <div><span>claim rate</span><div id="pool-rate">&#8212;</div></div>
  <div><span>runway</span><div id="pool-runway">&#8212;</div></div>
  <div><span>last ID cut</span><div id="pool-mark">&#8212;</div></div>
  <div><span>claims</span><div id="pool-claims">&#8212;</div></div>
  <div><span>oldest block's age</span><div id="age-oldest">&#8212;</div></div>
  <div><span>bound on an ID's age</span><div id="age-bound">&#8212;</div></div>
  <div><span>bound held by</span><div id="age-serving">&#8212;</div></div>
</div>

<h2>Election queue <span id="queue-count" class="muted"></span></h2>
<table>
  <thead><tr><th></th><th>node</th><th>host</th><th>pid</th><th>database</th><th>clock</th>
    <th>problem</th></tr></thead>
  <tbody id="queue"></tbody>
</table>

<h2>Last handovers</h2>
<table>
  <thead><tr><th>holder</th><th>elected</th><th>ended</th><th>held</th><th>why it ended</th>
    <th>generation / epoch</th></tr></thead>
  <tbody id="handovers"></tbody>
</table>

<h2>This node</h2>
<div class="grid">
  <div><span>role</span><div id="node-since">&#8212;</div></div>
  <div><span>ZooKeeper session</span><div id="node-session">&#8212;</div></div>
  <div><span>reaches the database</span><div id="node-db">&#8212;</div></div>
  <div><span>clock offset to the database</span><div id="node-clock">&#8212;</div></div>
</div>
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# One self-contained document: CSS and script inline, nothing fetched from elsewhere (no CDN,
# no font, no image).
PAGE: Final = (
    "<!doctype html>\n<html lang=en>\n<head>\n<meta charset=utf-8>\n"
    '<meta name=viewport content="width=device-width, initial-scale=1">\n'
    '<meta name=referrer content="no-referrer">\n'
    '<link rel=icon href="data:,">\n'
    "<title>allocator status</title>\n"
    f"<style>{_STYLE}</style>\n</head>\n<body>{_BODY}<script>{_SCRIPT}</script>\n</body>\n</html>\n"
).encode()

# Allows exactly this script and this style (by their SHA-256), requests to this origin only,
# and nothing else (no frames, no forms, no base URL).
CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'none'",
        f"script-src {_sha256(_SCRIPT)}",
        f"style-src {_sha256(_STYLE)}",
        "connect-src 'self'",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)

# Sent with :data:`PAGE`: the policy above, ``nosniff``, no referrer and no caching.
HEADERS: Final = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
