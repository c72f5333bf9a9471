from __future__ import annotations

import functools
import pickle
import time
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from streams.domain.cron import compile_cron
from streams.domain.errors import InvalidPolicy, InvalidSchedule, PermanentError
from streams.domain.policies import DstAmbiguous, DstNonexistent, DstPolicy
from streams.domain.schedule import (
    CronSchedule,
    DstOutcome,
    OneOffSchedule,
    Slot,
    apply_jitter,
    bounded_next_slot,
    next_slot,
    parse_cron,
    preview,
)

NY = "America/New_York"
# Wall times are UTC datetimes whose fields read as the zone's local time: UTC has no
# DST, so croniter steps them as a naive calendar would.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)
ZONES = (
    "UTC",
    NY,
    "Europe/London",
    "Europe/Berlin",
    "Australia/Lord_Howe",  # 30-minute DST shift
    "America/Sao_Paulo",  # DST used to start at midnight: the gap was 00:00-01:00
    "Asia/Kolkata",
    "Pacific/Chatham",  # +12:45/+13:45
)
POLICIES = tuple(
    DstPolicy(nonexistent=n, ambiguous=a) for n in DstNonexistent for a in DstAmbiguous
)


def utc_ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, s, tzinfo=UTC).timestamp() * 1000)


def local_ms(tz: str, y: int, mo: int, d: int, h: int = 0, mi: int = 0, fold: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, tzinfo=ZoneInfo(tz), fold=fold).timestamp() * 1000)


def offset_ms(tz: ZoneInfo, t_ms: int) -> int:
    off = datetime.fromtimestamp(t_ms // 1000, tz).utcoffset()
    assert off is not None
    return off // ONE_MS


def wall_offset_ms(aware: datetime) -> int:
    off = aware.utcoffset()
    assert off is not None
    return off // ONE_MS


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def slots_between(schedule: CronSchedule, start: int, end: int, dst: DstPolicy) -> list[Slot]:
    out: list[Slot] = []
    after = start
    while (slot := next_slot(schedule, after_ms=after, dst=dst)) is not None:
        if slot.scheduled_for_ms > end:
            break
        out.append(slot)
        after = slot.scheduled_for_ms
    return out


# --- the croniter oracle -------------------------------------------------------------------


def croniter_form(expr: str) -> str:
    # Our 6-field form has seconds first; croniter's has them last.
    fields = expr.split()
    return " ".join(fields[1:] + fields[:1]) if len(fields) == 6 else expr


@functools.cache
def offset_spread(tz: ZoneInfo, t_ms: int) -> int:
    """How far the offset moves within 3 h of t_ms: no test zone jumps by more than 1 h,
    so a local time further than this past the kth slot cannot map before it."""
    offsets = [offset_ms(tz, t_ms + k * 900_000) for k in range(-12, 13)]
    return max(offsets) - min(offsets) + 1000


def oracle(expr: str, tz_name: str, t0: int, count: int, dst: DstPolicy) -> list[Slot]:
    """Brute force: every croniter local time, mapped by the DST table, sorted, deduped."""
    tz = ZoneInfo(tz_name)
    lowest = min(offset_ms(tz, t0 + k * 900_000) for k in range(-16, 17))
    it = croniter(croniter_form(expr), EPOCH + timedelta(milliseconds=t0 + lowest - 1000))
    found: dict[int, str | None] = {}
    while True:
        wall: datetime = it.get_next(datetime)
        wall_ms = (wall - EPOCH) // ONE_MS
        off0 = wall_offset_ms(wall.replace(tzinfo=tz))
        off1 = wall_offset_ms(wall.replace(tzinfo=tz, fold=1))
        early, late = wall_ms - off0, wall_ms - off1
        if off0 == off1:
            cands: list[tuple[int, str | None]] = [(early, None)]
        elif off0 < off1:  # gap; fold=0 is the pre-transition offset
            shift = dst.nonexistent is DstNonexistent.SHIFT_FORWARD
            cands = [(early, "shifted_forward")] if shift else []
        else:
            by_policy: dict[DstAmbiguous, list[tuple[int, str | None]]] = {
                DstAmbiguous.FIRST: [(early, "ambiguous_first")],
                DstAmbiguous.LAST: [(late, "ambiguous_last")],
                DstAmbiguous.BOTH: [(early, "ambiguous_both_1"), (late, "ambiguous_both_2")],
            }
            cands = by_policy[dst.ambiguous]
        for inst, outcome in cands:
            if inst > t0 and (inst not in found or found[inst] == "shifted_forward"):
                found[inst] = outcome
        if len(found) >= count:
            kth = sorted(found)[count - 1]
            if wall_ms - max(off0, off1) - offset_spread(tz, kth) > kth:
                break
    return [Slot(scheduled_for_ms=i, dst_outcome=found[i]) for i in sorted(found)[:count]]


def _transitions(tz_name: str) -> list[int]:
    tz = ZoneInfo(tz_name)
    out = []
    day_s = 86_400
    t = utc_ms(2014, 1, 1) // 1000
    while t < utc_ms(2029, 1, 1) // 1000:
        before = offset_ms(tz, t * 1000)
        if before != offset_ms(tz, (t + day_s) * 1000):
            lo, hi = t, t + day_s
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset_ms(tz, mid * 1000) == before else (lo, mid)
            out.append(hi * 1000)
        t += day_s
    return out


TRANSITIONS = {z: _transitions(z) for z in ZONES}


@st.composite
def instants(draw: st.DrawFn, zone: str) -> int:
    near = TRANSITIONS[zone]
    if near and draw(st.integers(0, 3)) > 0:
        # Mostly just before a transition, so the dozen slots compared straddle it.
        return draw(st.sampled_from(near)) + draw(st.integers(-2 * 3_600_000, 3_600_000))
    return draw(st.integers(utc_ms(2015, 1, 1), utc_ms(2029, 1, 1)))


@st.composite
def cron_field(
    draw: st.DrawFn, lo: int, hi: int, *, names: tuple[str, ...] = (), top: int = -1, star: int
) -> str:
    """One field of our dialect, ``*`` with probability star/10; ``top`` is a literal above
    ``hi`` (7 for Sunday)."""
    top = max(top, hi)

    def value(v: int) -> str:
        if names and v - lo < len(names) and draw(st.booleans()):
            name = names[v - lo]
            return draw(st.sampled_from([name, name.upper(), name.title()]))
        return str(v)

    def element() -> str:
        kind = draw(st.sampled_from(["num", "range", "range_step", "start_step", "star_step"]))
        if kind == "star_step":
            return f"*/{draw(st.integers(1, hi - lo + 3))}"
        if kind == "start_step":
            # hi/S would be hi-hi/S, which croniter reads as the whole cycle.
            return f"{value(draw(st.integers(lo, hi - 1)))}/{draw(st.integers(1, hi - lo + 1))}"
        if kind == "num":
            return value(draw(st.integers(lo, top)))
        a = draw(st.integers(lo, top - 1))
        b = draw(st.integers(a + 1, top))  # a-a is the whole cycle to croniter
        rng = f"{value(a)}-{value(b)}"
        return rng if kind == "range" else f"{rng}/{draw(st.integers(1, b - a + 1))}"

    if draw(st.integers(0, 9)) < star:
        return "*"
    return ",".join(element() for _ in range(draw(st.integers(1, 3))))


MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@st.composite
def cron_exprs(draw: st.DrawFn, *, dst_heavy: bool = False) -> str:
    """Random valid expressions. ``dst_heavy`` ones fire every day, a few times an hour,
    so the dozen slots compared reach across a nearby DST transition."""
    seconds = draw(st.integers(0, 3)) == 0
    day_star = 9 if dst_heavy else 4
    dom = draw(st.sampled_from(["?"]) | cron_field(1, 31, star=day_star))
    fields = [
        draw(cron_field(0, 59, star=1 if dst_heavy else 4)),
        draw(cron_field(0, 23, star=6 if dst_heavy else 4)),
        dom if draw(st.booleans()) else "*",
        draw(cron_field(1, 12, names=MONTHS, star=day_star)),
        # croniter aliases 7 to Sunday only in its 5-field form.
        draw(cron_field(0, 6, names=DAYS, top=6 if seconds else 7, star=day_star)),
    ]
    if seconds:
        fields.insert(0, draw(cron_field(0, 59, star=0 if dst_heavy else 4)))
    expr = " ".join(fields)
    try:
        compile_cron(expr)
    except InvalidSchedule:
        assume(False)  # never fires
    return expr


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, int, DstPolicy]:
    zone = draw(st.sampled_from(ZONES[1:]) if draw(st.integers(0, 5)) else st.just("UTC"))
    expr = draw(cron_exprs(dst_heavy=draw(st.booleans())))
    return expr, zone, draw(instants(zone)), draw(st.sampled_from(POLICIES))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.lists(st.floats(0, 1, exclude_max=True), max_size=4))
def test_next_slot_matches_croniter_mapped_per_dst_policy(
    case: tuple[str, str, int, DstPolicy], probes: list[float]
) -> None:
    expr, zone, t0, dst = case
    schedule = parse_cron(expr, zone)
    expected = oracle(expr, zone, t0, 12, dst)
    assert preview(schedule, after_ms=t0, dst=dst, count=12) == expected
    # Any after_ms, not only slot instants, gives the first expected slot after it.
    for p in probes:
        after = t0 + int(p * (expected[-1].scheduled_for_ms - t0))
        want = next(s for s in expected if s.scheduled_for_ms > after)
        assert next_slot(schedule, after_ms=after, dst=dst) == want


@settings(max_examples=200, deadline=None)
@given(cases(), st.integers(1, 40))
def test_next_slot_is_strictly_after_and_increasing(
    case: tuple[str, str, int, DstPolicy], steps: int
) -> None:
    expr, zone, t0, dst = case
    schedule = parse_cron(expr, zone)
    after = t0
    for _ in range(steps):
        slot = next_slot(schedule, after_ms=after, dst=dst)
        assert slot is not None
        assert slot.scheduled_for_ms > after
        after = slot.scheduled_for_ms


SWEEP_ZONES = (NY, "Australia/Lord_Howe", "Pacific/Chatham", "America/Sao_Paulo")
SWEEP_EXPRS = ("*/7 * * * *", "0,30 * * * *", "*/20 */7 * * * *", "15 2 * * *", "45 2,3 * * *")


@pytest.mark.parametrize("zone", SWEEP_ZONES)
def test_sweep_across_transitions_matches_oracle(zone: str) -> None:
    year = 2018 if zone == "America/Sao_Paulo" else 2026
    transitions = [t for t in TRANSITIONS[zone] if utc_ms(year, 1, 1) <= t < utc_ms(year + 1, 1, 1)]
    assert len(transitions) == 2
    for t in transitions:
        for t0 in range(t - 90 * 60_000, t + 91 * 60_000, 13 * 60_000 + 1):
            for expr in SWEEP_EXPRS:
                schedule = parse_cron(expr, zone)
                for dst in POLICIES:
                    got = preview(schedule, after_ms=t0, dst=dst, count=8)
                    assert got == oracle(expr, zone, t0, 8, dst), (expr, iso(t0), dst)


# --- DST in America/New_York ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("nonexistent", "expected"),
    [
        (DstNonexistent.SKIP, ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"]),
        (
            DstNonexistent.SHIFT_FORWARD,
            ["2026-03-07T07:30:00Z", "2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z"],
        ),
    ],
)
def test_spring_forward_gap(nonexistent: DstNonexistent, expected: list[str]) -> None:
    schedule = parse_cron("30 2 * * *", NY)
    dst = DstPolicy(nonexistent=nonexistent)
    slots = slots_between(schedule, utc_ms(2026, 3, 7), utc_ms(2026, 3, 9, 12), dst)
    assert [iso(s.scheduled_for_ms) for s in slots] == expected
    if nonexistent is DstNonexistent.SHIFT_FORWARD:
        # 02:30 does not exist; shifted by the 1 h gap it is 03:30 EDT.
        assert slots[1].dst_outcome == "shifted_forward"
        assert slots[1].scheduled_for_ms == local_ms(NY, 2026, 3, 8, 3, 30)


@pytest.mark.parametrize(
    ("ambiguous", "expected"),
    [
        (DstAmbiguous.FIRST, [("2026-11-01T05:30:00Z", "ambiguous_first")]),
        (DstAmbiguous.LAST, [("2026-11-01T06:30:00Z", "ambiguous_last")]),
        (
            DstAmbiguous.BOTH,
            [
                ("2026-11-01T05:30:00Z", "ambiguous_both_1"),
                ("2026-11-01T06:30:00Z", "ambiguous_both_2"),
            ],
        ),
    ],
)
def test_fall_back_overlap(ambiguous: DstAmbiguous, expected: list[tuple[str, str]]) -> None:
    schedule = parse_cron("30 1 * * *", NY)
    dst = DstPolicy(ambiguous=ambiguous)
    slots = slots_between(schedule, utc_ms(2026, 11, 1), utc_ms(2026, 11, 1, 12), dst)
    assert [(iso(s.scheduled_for_ms), s.dst_outcome) for s in slots] == expected


def test_both_returns_second_instance_after_first() -> None:
    schedule = parse_cron("30 1 * * *", NY)
    dst = DstPolicy(ambiguous=DstAmbiguous.BOTH)
    first = next_slot(schedule, after_ms=utc_ms(2026, 11, 1), dst=dst)
    assert first == Slot(
        scheduled_for_ms=utc_ms(2026, 11, 1, 5, 30), dst_outcome="ambiguous_both_1"
    )
    second = next_slot(schedule, after_ms=first.scheduled_for_ms, dst=dst)
    assert second == Slot(
        scheduled_for_ms=utc_ms(2026, 11, 1, 6, 30), dst_outcome="ambiguous_both_2"
    )
    # ... also when asked from inside the hour between the two showings.
    inside = next_slot(schedule, after_ms=utc_ms(2026, 11, 1, 5, 59, 59), dst=dst)
    assert inside == second
    for single in (DstAmbiguous.FIRST, DstAmbiguous.LAST):
        one = DstPolicy(ambiguous=single)
        slot = next_slot(schedule, after_ms=utc_ms(2026, 11, 1), dst=one)
        assert slot is not None
        after = next_slot(schedule, after_ms=slot.scheduled_for_ms, dst=one)
        assert after == Slot(scheduled_for_ms=utc_ms(2026, 11, 2, 6, 30))


def test_quarter_hourly_fires_in_one_pass_of_the_repeated_hour() -> None:
    schedule = parse_cron("*/15 * * * *", NY)
    window = (utc_ms(2026, 11, 1, 4, 40), utc_ms(2026, 11, 1, 7, 10))
    hours = {
        DstAmbiguous.FIRST: ["04:", "05:", "05:", "05:", "05:", "07:"],
        DstAmbiguous.LAST: ["04:", "06:", "06:", "06:", "06:", "07:"],
    }
    for policy, want in hours.items():
        slots = slots_between(schedule, *window, DstPolicy(ambiguous=policy))
        assert [iso(s.scheduled_for_ms)[11:14] for s in slots] == want
    both = slots_between(schedule, *window, DstPolicy(ambiguous=DstAmbiguous.BOTH))
    assert len(both) == 10
    assert [s.dst_outcome for s in both[1:9]] == ["ambiguous_both_1"] * 4 + ["ambiguous_both_2"] * 4


@pytest.mark.parametrize("dst", POLICIES, ids=lambda p: f"{p.nonexistent}-{p.ambiguous}")
def test_hourly_slot_counts_per_local_day(dst: DstPolicy) -> None:
    schedule = parse_cron("0 * * * *", NY)
    tz = ZoneInfo(NY)
    slots = slots_between(schedule, utc_ms(2026, 3, 6, 12), utc_ms(2026, 11, 3, 12), dst)
    per_day = Counter(datetime.fromtimestamp(s.scheduled_for_ms / 1000, tz).date() for s in slots)
    # Spring: 02:00 is skipped, or shifted onto 03:00, which is the same slot -> 23 either way.
    assert per_day[date(2026, 3, 8)] == 23
    assert per_day[date(2026, 11, 1)] == (25 if dst.ambiguous is DstAmbiguous.BOTH else 24)
    assert (
        per_day[date(2026, 3, 7)] == per_day[date(2026, 7, 1)] == per_day[date(2026, 11, 2)] == 24
    )
    assert all(
        n == 24
        for d, n in per_day.items()
        if date(2026, 3, 6) < d < date(2026, 11, 3)
        and d not in (date(2026, 3, 8), date(2026, 11, 1))
    )
    instants = [s.scheduled_for_ms for s in slots]
    assert instants == sorted(set(instants))


def test_shift_forward_keeps_plain_slot_when_shifted_time_collides() -> None:
    schedule = parse_cron("0 2,3 * * *", NY)
    slots = slots_between(schedule, utc_ms(2026, 3, 8), utc_ms(2026, 3, 8, 12), DstPolicy())
    assert slots == [Slot(scheduled_for_ms=local_ms(NY, 2026, 3, 8, 3))]


def test_half_hour_gap_lord_howe() -> None:
    # Lord Howe springs forward 02:00 -> 02:30; 02:15 shifts by 30 min to 02:45.
    schedule = parse_cron("15 2 * * *", "Australia/Lord_Howe")
    after = utc_ms(2026, 10, 3, 12)
    slot = next_slot(schedule, after_ms=after, dst=DstPolicy())
    assert slot == Slot(
        scheduled_for_ms=local_ms("Australia/Lord_Howe", 2026, 10, 4, 2, 45),
        dst_outcome=DstOutcome.SHIFTED_FORWARD,
    )


def test_midnight_gap_sao_paulo_2018() -> None:
    schedule = parse_cron("@daily", "America/Sao_Paulo")
    after = utc_ms(2018, 11, 3, 12)
    skip = next_slot(schedule, after_ms=after, dst=DstPolicy(nonexistent=DstNonexistent.SKIP))
    shifted = next_slot(schedule, after_ms=after, dst=DstPolicy())
    assert skip == Slot(scheduled_for_ms=local_ms("America/Sao_Paulo", 2018, 11, 5))
    assert shifted == Slot(
        scheduled_for_ms=local_ms("America/Sao_Paulo", 2018, 11, 4, 1),
        dst_outcome="shifted_forward",
    )


def test_samoa_skipped_day_shifts_onto_next_day() -> None:
    # Pacific/Apia skipped 2011-12-30 entirely; its 09:00 shifted by 24 h is the 31st's 09:00.
    schedule = parse_cron("0 9 * * *", "Pacific/Apia")
    want = [Slot(scheduled_for_ms=local_ms("Pacific/Apia", 2011, 12, d, 9)) for d in (28, 29, 31)]
    for policy in (DstPolicy(), DstPolicy(nonexistent=DstNonexistent.SKIP)):
        got = slots_between(schedule, utc_ms(2011, 12, 28), utc_ms(2011, 12, 31), policy)
        assert got == want


def test_every_second_across_both_transitions() -> None:
    schedule = parse_cron("* * * * * *", NY)
    spring, fall = utc_ms(2026, 3, 8, 7), utc_ms(2026, 11, 1, 6)
    for dst in POLICIES:
        got = preview(schedule, after_ms=spring - 2000, dst=dst, count=3)
        # 01:59:59 EST, then 03:00:00 EDT (02:00:00 shifted lands on it), 03:00:01 EDT.
        assert got == [Slot(scheduled_for_ms=spring + d) for d in (-1000, 0, 1000)]
        # Inside the gap's shift window the shifted times are due; skipped ones are not.
        shifted = next_slot(schedule, after_ms=spring + 1_800_000, dst=dst)
        assert shifted is not None and shifted.scheduled_for_ms == spring + 1_801_000
        if dst.nonexistent is DstNonexistent.SHIFT_FORWARD:
            assert shifted.dst_outcome is None  # 02:30:01 shifted onto real 03:30:01
        # From 01:59:58 EDT: the rest of the first pass, then per policy the second pass
        # (01:00:00 EST = fall) or nothing until 02:00:00 EST.
        want = {
            DstAmbiguous.FIRST: [fall - 1000, fall + 3_600_000, fall + 3_601_000],
            DstAmbiguous.LAST: [fall, fall + 1000, fall + 2000],
            DstAmbiguous.BOTH: [fall - 1000, fall, fall + 1000],
        }[dst.ambiguous]
        got = preview(schedule, after_ms=fall - 2000, dst=dst, count=3)
        assert [s.scheduled_for_ms for s in got] == want


# --- cron dialect --------------------------------------------------------------------------


def test_six_field_leading_seconds() -> None:
    schedule = parse_cron("*/5 * * * * *", "UTC")
    got = preview(schedule, after_ms=utc_ms(2026, 1, 1) + 1234, dst=DstPolicy(), count=20)
    gaps = {b.scheduled_for_ms - a.scheduled_for_ms for a, b in pairwise(got)}
    assert got[0].scheduled_for_ms == utc_ms(2026, 1, 1, 0, 0, 5)
    assert gaps == {5000}
    assert next_slot(parse_cron("30 0 12 * * *"), after_ms=0, dst=DstPolicy()) == Slot(
        scheduled_for_ms=utc_ms(1970, 1, 1, 12, 0, 30)
    )


@pytest.mark.parametrize(
    ("macro", "plain"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
    ],
)
def test_macros(macro: str, plain: str) -> None:
    dst = DstPolicy()
    a = preview(parse_cron(macro, NY), after_ms=utc_ms(2026, 2, 27), dst=dst, count=3)
    b = preview(parse_cron(plain, NY), after_ms=utc_ms(2026, 2, 27), dst=dst, count=3)
    assert a == b


def _days(expr: str, start: tuple[int, int, int], n: int) -> list[str]:
    slots = preview(parse_cron(expr), after_ms=utc_ms(*start) - 1, dst=DstPolicy(), count=n)
    return [iso(s.scheduled_for_ms)[:10] for s in slots]


def test_day_of_month_or_day_of_week() -> None:
    # 2026-06-01 is a Monday; both fields restricted -> either matches.
    assert _days("0 0 3 * mon", (2026, 6, 1), 4) == [
        "2026-06-01",
        "2026-06-03",
        "2026-06-08",
        "2026-06-15",
    ]
    # One field unrestricted -> only the other counts.
    assert _days("0 0 * * mon", (2026, 6, 1), 2) == ["2026-06-01", "2026-06-08"]
    assert _days("0 0 3 * ?", (2026, 6, 1), 2) == ["2026-06-03", "2026-07-03"]


def test_dialect_details() -> None:
    assert _days("0 0 * * 7", (2026, 6, 1), 1) == ["2026-06-07"]  # 7 is Sunday too
    assert _days("0 0 * * sat-7", (2026, 6, 1), 2) == ["2026-06-06", "2026-06-07"]
    assert _days("0 0 29 feb *", (2026, 1, 1), 2) == ["2028-02-29", "2032-02-29"]
    assert _days("0 0 29 2 *", (2097, 1, 1), 1) == ["2104-02-29"]  # 2100 is not a leap year
    assert _days("0 0 31 * *", (2026, 1, 1), 3) == ["2026-01-31", "2026-03-31", "2026-05-31"]
    # A-A is just A (croniter would read it as the whole cycle).
    hours = preview(parse_cron("0 5-5 * * *"), after_ms=0, dst=DstPolicy(), count=2)
    assert [iso(s.scheduled_for_ms) for s in hours] == [
        "1970-01-01T05:00:00Z",
        "1970-01-02T05:00:00Z",
    ]
    assert parse_cron("  */5   * * *\t*  ").expr == "*/5 * * * *"


INVALID_CRON = [
    "",
    "   ",
    "* * * *",
    "* * * * * * *",
    "60 * * * *",
    "* 24 * * *",
    "* * 0 * *",
    "* * 32 * *",
    "* * * 0 *",
    "* * * 13 *",
    "* * * * 8",
    "60 * * * * *",
    "*/0 * * * *",
    "1-10/0 * * * *",
    "5/0 * * * *",
    "a * * * *",
    "1,,2 * * * *",
    "1, * * * *",
    "-5 * * * *",
    "5- * * * *",
    "1-2-3 * * * *",
    "*/ * * * *",
    "*/x * * * *",
    "1/2/3 * * * *",
    "*,5 * * * *",
    "10-5 * * * *",
    "* * * * fri-mon",
    "* * * foo *",
    "* * L * *",
    "* * 15W * *",
    "* * * * 5#2",
    "* * * * 5L",
    "H * * * *",
    "? * * * *",
    "0 0 30 2 *",
    "0 0 31 4 *",
    "0 0 31 2,4,6,9,11 *",
    "0 0 30,31 feb *",
    "@reboot",
    "@every 5m",
    "@weekly 1",
    "\uff11 * * * *",  # a fullwidth digit
    "00005 * * * *",
    "0 0 1 1 * 2026",
]


@pytest.mark.parametrize("expr", INVALID_CRON)
def test_invalid_cron_is_rejected_with_field(expr: str) -> None:
    with pytest.raises(InvalidSchedule) as err:
        parse_cron(expr, "UTC")
    assert err.value.field == "schedule.cron"
    assert isinstance(err.value, PermanentError)
    assert str(err.value)


@pytest.mark.parametrize(
    "tz",
    [
        "",
        "  ",
        "local",
        "Local",
        "localtime",
        "Mars/Olympus",
        "America",
        "../../etc/passwd",
        "/usr/share/zoneinfo/UTC",
        "zone.tab",
        "utc/",
        "America/New York",
    ],
)
def test_invalid_timezone_is_rejected_with_field(tz: str) -> None:
    with pytest.raises(InvalidSchedule) as err:
        parse_cron("0 * * * *", tz)
    assert err.value.field == "schedule.timezone"


def test_never_firing_expressions_are_rejected_fast() -> None:
    start = time.perf_counter()
    for expr in ("0 0 30 2 *", "0 0 31 4 *", "59 59 23 31 2,4,6,9,11 *"):
        compile_cron.cache_clear()
        with pytest.raises(InvalidSchedule, match="never fires"):
            parse_cron(expr, "UTC")
    assert time.perf_counter() - start < 0.05


def test_valid_edge_expressions_are_accepted() -> None:
    for expr in (
        "0 0 29 2 *",
        "0 0 30 2 mon",
        "0 0 31 * *",
        "59 23 31 12 7",
        "0 0 ? * ?",
        "*/61 * * * *",
        "0 0 1-31 jan-dec sun-sat",
        "0 0 * * MON-FRI",
    ):
        assert parse_cron(expr, "Europe/Berlin").timezone == "Europe/Berlin"


# --- schedule types and helpers ------------------------------------------------------------


def test_cron_schedule_is_validated_on_construction_and_compares_by_value() -> None:
    with pytest.raises(InvalidSchedule):
        CronSchedule(expr="nope")
    a, b = CronSchedule(expr="0 * * * *", timezone=NY), parse_cron("0 * * * *", NY)
    assert a == b and hash(a) == hash(b)
    assert "spec" not in repr(a)
    assert pickle.loads(pickle.dumps(a)) == a
    restored = pickle.loads(pickle.dumps(a))
    assert next_slot(restored, after_ms=0, dst=DstPolicy()) == next_slot(
        a, after_ms=0, dst=DstPolicy()
    )


def test_one_off() -> None:
    s = OneOffSchedule(run_at_ms=1_000)
    assert next_slot(s, after_ms=999, dst=DstPolicy()) == Slot(scheduled_for_ms=1_000)
    assert next_slot(s, after_ms=1_000, dst=DstPolicy()) is None
    assert preview(s, after_ms=0, dst=DstPolicy(), count=5) == [Slot(scheduled_for_ms=1_000)]
    for bad in (-1, True, 1.5, 10**20):
        with pytest.raises(InvalidSchedule) as err:
            OneOffSchedule(run_at_ms=bad)  # type: ignore[arg-type]
        assert err.value.field == "schedule.run_at_ms"


def test_preview_count() -> None:
    s = parse_cron("0 * * * *")
    assert preview(s, after_ms=0, dst=DstPolicy(), count=0) == []
    assert len(preview(s, after_ms=0, dst=DstPolicy())) == 5
    with pytest.raises(PermanentError):
        preview(s, after_ms=0, dst=DstPolicy(), count=-1)


def test_bounded_next_slot() -> None:
    s = parse_cron("0 * * * *")
    dst = DstPolicy()
    hour = 3_600_000
    assert bounded_next_slot(s, after_ms=0, dst=dst, start_at_ms=None, end_at_ms=None) == Slot(
        scheduled_for_ms=hour
    )
    # start is inclusive: a slot exactly at start counts.
    got = bounded_next_slot(s, after_ms=0, dst=dst, start_at_ms=5 * hour, end_at_ms=None)
    assert got == Slot(scheduled_for_ms=5 * hour)
    got = bounded_next_slot(s, after_ms=0, dst=dst, start_at_ms=5 * hour + 1, end_at_ms=None)
    assert got == Slot(scheduled_for_ms=6 * hour)
    # start before after_ms does not move backwards.
    got = bounded_next_slot(s, after_ms=7 * hour, dst=dst, start_at_ms=hour, end_at_ms=None)
    assert got == Slot(scheduled_for_ms=8 * hour)
    # end is inclusive; past it there is nothing.
    got = bounded_next_slot(s, after_ms=0, dst=dst, start_at_ms=None, end_at_ms=hour)
    assert got == Slot(scheduled_for_ms=hour)
    assert bounded_next_slot(s, after_ms=0, dst=dst, start_at_ms=None, end_at_ms=hour - 1) is None
    one = OneOffSchedule(run_at_ms=10)
    assert bounded_next_slot(one, after_ms=0, dst=dst, start_at_ms=11, end_at_ms=None) is None


def test_far_future_and_past_after_ms() -> None:
    s = parse_cron("0 0 1 1 *")
    assert next_slot(s, after_ms=10**16, dst=DstPolicy()) is None
    # Nothing before 1900 is scheduled.
    first = next_slot(s, after_ms=-(10**15), dst=DstPolicy())
    assert first is not None and iso(first.scheduled_for_ms) == "1901-01-01T00:00:00Z"


@settings(max_examples=300)
@given(
    st.integers(0, 2**45),
    st.floats(0, 86400, allow_nan=False),
    st.text(max_size=20),
)
def test_jitter_is_deterministic_and_in_range(slot_ms: int, jitter_s: float, job_id: str) -> None:
    due = apply_jitter(slot_ms, jitter_s=jitter_s, job_id=job_id)
    assert due == apply_jitter(slot_ms, jitter_s=jitter_s, job_id=job_id)
    assert slot_ms <= due
    assert due - slot_ms < max(jitter_s * 1000, 1)


def test_jitter_spreads_and_validates() -> None:
    delays = {apply_jitter(0, jitter_s=60, job_id=f"job-{i}") for i in range(200)}
    assert len(delays) > 150 and max(delays) < 60_000
    assert apply_jitter(5, jitter_s=0, job_id="j") == 5
    for bad in (-1.0, float("nan"), float("inf"), 86401.0):
        with pytest.raises(InvalidPolicy) as err:
            apply_jitter(0, jitter_s=bad, job_id="j")
        assert err.value.field == "jitter_s"


def test_remembered_next_slots_depend_on_zone_and_dst_policy() -> None:
    """next_slot remembers answers by (expression, zone, policy, instant): the jobs of a
    spike share them. Asked for the same instant under every zone and policy in turn, each
    answer must be the one computed afresh."""
    from streams.domain import schedule as module

    expr, t0 = "0 30 2 * * *", utc_ms(2026, 3, 28, 12)  # the day before the EU spring gap
    fresh = {}
    for zone in ZONES:
        for dst in POLICIES:
            module._remembered_next_slot.cache_clear()
            fresh[zone, dst] = next_slot(parse_cron(expr, zone), after_ms=t0, dst=dst)
    assert len(set(fresh.values())) > 2  # the cases do differ
    for _ in range(2):
        for (zone, dst), slot in fresh.items():
            assert next_slot(parse_cron(expr, zone), after_ms=t0, dst=dst) == slot
