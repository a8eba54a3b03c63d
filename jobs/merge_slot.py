"""A repository's merge slot: one loop at a time merges, or brings its branch up to date
to merge.

Every merge moves the default branch, and the gate merges only a head that contains it
(verify ran on that combination), so when several loops of one repository reach the gate
together, each merge sends the others back to merge the base in, verify again and be
reviewed again; a loop that loses that race ``merge.max_fix_turns`` times is refused
(the fleet benchmark saw one of fifty). With the slot, the gate that would merge or
send its loop back to catch up takes the repository's slot first; while another loop
holds it, the gate waits instead, in line, and the first in line is woken when that
loop ends (merged, refused, cancelled, failed). So a loop catches up once, when its
turn comes, and no loop's catching up is wasted by another loop's merge. One waiter is
woken at a time, not all of them: each woken gate reads a dozen things from GitHub,
and all but one of them would only find the slot taken again (a fleet's gates ran four
times a loop, issue 43); a woken gate that does not take the slot (its loop waits for a
person now) wakes the next (``pass_on``). The slot lapses on its own (``SLOT_SECONDS``)
if its holder stalls, and a waiting gate looks again every ``RECHECK_SECONDS``; it
orders loopbot's own merges and decides nothing: the gate still merges only on the
facts it reads.
"""

from __future__ import annotations

from redis import Redis

from bot.core.ids import LoopId
from bot.io.queues import enqueue_gate

SLOT_SECONDS = 1200  # a catch-up is a turn, verify and a review: minutes, not hours
RECHECK_SECONDS = 300  # a waiting gate's own look again, if its wake-up was lost

# The line is a list (first come, first woken), each loop in it once. A woken waiter is
# off the line until its gate runs (its job may wait in the queue meanwhile), and a gate
# that came later may find the slot free then and take it: the woken one, refused, goes
# back to the front of the line (the woken set), not to its end, or each such newcomer
# would put it behind the loops that came after it.
_TAKE = """
local held = redis.call('GET', KEYS[1])
if (not held) or held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('LREM', KEYS[2], 0, ARGV[1])
  redis.call('SREM', KEYS[3], ARGV[1])
  return false
end
if not redis.call('LPOS', KEYS[2], ARGV[1]) then
  if redis.call('SREM', KEYS[3], ARGV[1]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[1])
  else
    redis.call('RPUSH', KEYS[2], ARGV[1])
  end
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return held
"""

# Lets go (when ARGV[1] holds it) and leaves the line; returns the first waiter, taken
# off the line (and marked woken), when it let go, or when it was woken itself and ends
# before it took the slot (nobody holds it: the next one's turn).
_RELEASE = """
redis.call('LREM', KEYS[2], 0, ARGV[1])
local woken = redis.call('SREM', KEYS[3], ARGV[1]) == 1
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or (woken and not held) then
  redis.call('DEL', KEYS[1])
  local first = redis.call('LPOP', KEYS[2])
  if first then
    redis.call('SADD', KEYS[3], first)
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  return first
end
return false
"""

# The first waiter, taken off the line (and marked woken), when nobody holds the slot.
_PASS = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local first = redis.call('LPOP', KEYS[2])
if first then
  redis.call('SADD', KEYS[3], first)
  redis.call('PEXPIRE', KEYS[3], ARGV[1])
end
return first
"""


def _keys(repo: str) -> list[str]:
    return [
        f"loopbot:merge-slot:{repo}",
        f"loopbot:merge-slot-waiting:{repo}",
        f"loopbot:merge-slot-woken:{repo}",
    ]


def take(redis: Redis, loop: LoopId, seconds: float = SLOT_SECONDS) -> str | None:
    """Take (or keep) ``loop``'s repository's slot: None when ``loop`` holds it now,
    else the key of the loop that does (``loop`` is then woken when it lets go)."""
    held = redis.eval(_TAKE, 3, *_keys(loop.repo), loop.key, int(seconds * 1000))
    if not held:
        return None
    return held.decode() if isinstance(held, bytes) else str(held)


_KEEP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def keep(redis: Redis, loop: LoopId, seconds: float = SLOT_SECONDS) -> bool:
    """``loop`` still holds its repository's slot: its time starts over (each run of its
    gate, whatever it decides: waiting for its new head's checks, a review). Whether it
    held it."""
    return bool(redis.eval(_KEEP, 1, _keys(loop.repo)[0], loop.key, int(seconds * 1000)))


def release(redis: Redis, loop: LoopId) -> None:
    """``loop`` ended: its slot (if it holds it) is free, it leaves the line, and the
    gate of the first loop in line runs now."""
    _wake(redis, redis.eval(_RELEASE, 3, *_keys(loop.repo), loop.key, SLOT_SECONDS * 1000))


def pass_on(redis: Redis, repo: str) -> None:
    """A gate run ends without the slot: if nobody holds it (a woken gate whose loop did
    not need it now), the next in line is woken, so the line never stalls on one."""
    _wake(redis, redis.eval(_PASS, 3, *_keys(repo), SLOT_SECONDS * 1000))


def _wake(redis: Redis, member: object) -> None:
    if member:
        other = LoopId.parse(member.decode() if isinstance(member, bytes) else str(member))
        enqueue_gate(redis, other.repo, other.issue)


def held(redis: Redis) -> dict[str, str]:
    """Every repository's slot that is held now: repository -> the holder's key."""
    prefix = _keys("")[0]
    out = {}
    for name in redis.scan_iter(match=prefix + "*", count=500):
        repo = (name.decode() if isinstance(name, bytes) else name)[len(prefix) :]
        if (key := holder(redis, repo)) is not None:
            out[repo] = key
    return out


def holder(redis: Redis, repo: str) -> str | None:
    held = redis.get(_keys(repo)[0])
    return held.decode() if isinstance(held, bytes) else held
