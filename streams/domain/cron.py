"""The cron dialect: parsing, validation and iteration over naive local wall-clock times.

This module knows nothing about time zones; ``schedule.py`` maps the local times produced
here to UTC instants under a DST policy.

Dialect
    5 fields   ``minute hour day-of-month month day-of-week``
    6 fields   ``second minute hour day-of-month month day-of-week`` (seconds LEADING, as in
               Quartz; croniter's own 6-field form puts them last)
    macros     ``@yearly`` ``@annually`` ``@monthly`` ``@weekly`` ``@daily`` ``@midnight``
               ``@hourly`` (``@reboot`` has no meaning for a scheduler and is rejected)

Per field: ``*``, ``N``, ``A-B``, ``*/S``, ``A-B/S``, ``A/S`` (= ``A-max/S``) and comma lists
of those. Month names ``jan``..``dec`` and weekday names ``sun``..``sat`` (any case) stand
for numbers. Day-of-week is 0-7 with both 0 and 7 meaning Sunday. ``?`` is accepted for
day-of-month or day-of-week alone and means ``*``. Rejected: ``L``, ``W``, ``#``, ``H``,
a year field, wrap-around ranges such as ``fri-mon`` (write ``fri-sat,sun-mon``), ``*/0``.
``A-A`` means just ``A``, and ``max/S`` just ``max`` (croniter reads both as the whole
cycle; we follow Vixie cron).

Day-of-month and day-of-week combine like Vixie cron and croniter: when both are
restricted a day matches if EITHER matches (``0 0 1 * mon`` fires on the 1st and on every
Monday); when one is unrestricted only the other one counts. A field is unrestricted when
it is ``*``/``?``, or when it lists every value and the other field contains a ``*``
(croniter's rule, kept so that croniter can serve as an independent oracle in tests).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import date
from functools import lru_cache

from streams.domain.errors import InvalidSchedule

CRON_FIELD = "schedule.cron"
MAX_EXPR_LEN = 512

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
_WEEKDAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_NUMBER = re.compile(r"[0-9]{1,4}")

# (name, lowest, highest for */S and A/S, highest literal, names)
_FieldDef = tuple[str, int, int, int, dict[str, int]]
_SECOND: _FieldDef = ("second", 0, 59, 59, {})
_MINUTE: _FieldDef = ("minute", 0, 59, 59, {})
_HOUR: _FieldDef = ("hour", 0, 23, 23, {})
_DOM: _FieldDef = ("day-of-month", 1, 31, 31, {})
_MONTH: _FieldDef = ("month", 1, 12, 12, _MONTHS)
_DOW: _FieldDef = ("day-of-week", 0, 6, 7, _WEEKDAYS)

_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MAX_DAYS_IN_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# A schedule that passed validation fires at least once every 8 years (29 Feb after a
# skipped century leap year is the worst case), so searching 9 years ahead never gives up
# on a schedule that would still fire.
SEARCH_YEARS = 9
_LAST_YEAR = 9990

_ANY_DAY, _DOM_ONLY, _DOW_ONLY, _DOM_OR_DOW = range(4)

LocalTime = tuple[int, int, int, int, int]
"""(local epoch seconds, year, month, day, second-of-day) of a naive local wall time."""


def _bad(expr: str, detail: str) -> InvalidSchedule:
    return InvalidSchedule(f"invalid cron expression {expr!r}: {detail}", field=CRON_FIELD)


def _value(expr: str, fd: _FieldDef, token: str) -> int:
    name, lo, _, hi, names = fd
    if _NUMBER.fullmatch(token):
        value = int(token)
    elif token.lower() in names:
        value = names[token.lower()]
    else:
        raise _bad(expr, f"{name} field: {token!r} is not a number or a known name")
    if not lo <= value <= hi:
        raise _bad(expr, f"{name} field: {value} is out of range {lo}-{hi}")
    return value


def _item(expr: str, fd: _FieldDef, item: str) -> range:
    name, lo, step_hi, _, _ = fd
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _NUMBER.fullmatch(step_text):
            raise _bad(expr, f"{name} field: step {step_text!r} in {item!r} is not a number")
        step = int(step_text)
        if step == 0:
            raise _bad(expr, f"{name} field: step 0 in {item!r} would never advance")
    if base == "*":
        return range(lo, step_hi + 1, step)
    first, dash, last = base.partition("-")
    start = _value(expr, fd, first)
    end = _value(expr, fd, last) if dash else (step_hi if slash else start)
    if start > end:
        raise _bad(expr, f"{name} field: {item!r} runs backwards; wrap-around is not supported")
    return range(start, end + 1, step)


def _field(expr: str, fd: _FieldDef, text: str) -> frozenset[int]:
    name, lo, step_hi, _, _ = fd
    if text == "*" or (text == "?" and (fd is _DOM or fd is _DOW)):
        return frozenset(range(lo, step_hi + 1))
    if text == "?":
        raise _bad(expr, f"{name} field: '?' is only allowed for day-of-month or day-of-week")
    values: set[int] = set()
    for item in text.split(","):
        if item in ("*", "?"):
            raise _bad(expr, f"{name} field: {item!r} cannot be combined with other values")
        if not item:
            raise _bad(expr, f"{name} field: empty item in {text!r}")
        values.update(_item(expr, fd, item))
    if fd is _DOW and 7 in values:
        values = (values - {7}) | {0}
    return frozenset(values)


@dataclass(frozen=True, kw_only=True, slots=True)
class CronSpec:
    """A compiled cron expression; iterate with :meth:`next_after`."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[bool, ...]  # indexed 1..12
    weekday_skip: tuple[int, ...]  # cron weekday -> days until the next allowed weekday
    day_mode: int

    def next_after(self, local_ms: int) -> LocalTime | None:
        """First matching local wall time strictly after ``local_ms`` (naive epoch ms).

        ``None`` when nothing matches within the search horizon or before year 9990.
        """
        start = local_ms // 1000 + 1
        days, sod = divmod(start, 86400)
        d0 = date.fromordinal(EPOCH_ORDINAL + days)
        y, mo, d = d0.year, d0.month, d0.day
        limit = min(y + SEARCH_YEARS, _LAST_YEAR)
        while True:
            found = self._day_at_or_after(y, mo, d, limit)
            if found is None:
                return None
            if found != (y, mo, d):
                y, mo, d = found
                sod = 0
            tod = self._time_at_or_after(sod)
            if tod is not None:
                ordinal = date(y, mo, d).toordinal()
                return (ordinal - EPOCH_ORDINAL) * 86400 + tod, y, mo, d, tod
            d += 1  # past the month end is fine: _day_at_or_after rolls over
            sod = 0

    def _day_at_or_after(self, y: int, mo: int, d: int, limit: int) -> tuple[int, int, int] | None:
        months = self.months
        while y <= limit:
            if months[mo]:
                dim = _DAYS_IN_MONTH[mo]
                if mo == 2 and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0):
                    dim = 29
                if d <= dim:
                    day = self._day_in_month(y, mo, d, dim)
                    if day is not None:
                        return y, mo, day
            mo += 1
            d = 1
            if mo == 13:
                mo = 1
                y += 1
        return None

    def _day_in_month(self, y: int, mo: int, d: int, dim: int) -> int | None:
        mode = self.day_mode
        if mode == _ANY_DAY:
            return d
        best = dim + 1
        if mode != _DOW_ONLY:
            i = bisect_left(self.days, d)
            if i < len(self.days):
                best = self.days[i]
        if mode != _DOM_ONLY:
            # date.toordinal() % 7 is 0 on Sundays, matching cron's weekday numbering.
            best = min(best, d + self.weekday_skip[date(y, mo, d).toordinal() % 7])
        return best if best <= dim else None

    def _time_at_or_after(self, sod: int) -> int | None:
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        h, rest = divmod(sod, 3600)
        m, s = divmod(rest, 60)
        i = bisect_left(hours, h)
        if i == len(hours):
            return None
        if hours[i] == h:
            j = bisect_left(minutes, m)
            if j < len(minutes) and minutes[j] == m:
                k = bisect_left(seconds, s)
                if k < len(seconds):
                    return sod - s + seconds[k]
                j += 1
            if j < len(minutes):
                return h * 3600 + minutes[j] * 60 + seconds[0]
            i += 1
            if i == len(hours):
                return None
        return hours[i] * 3600 + minutes[0] * 60 + seconds[0]


def _split(expr: str) -> list[str]:
    if len(expr) > MAX_EXPR_LEN:
        raise _bad(expr[:40] + "...", f"longer than {MAX_EXPR_LEN} characters")
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() == "@reboot":
            raise _bad(expr, "@reboot is not supported by a scheduler (there is no boot)")
        macro = MACROS.get(text.lower())
        if macro is None:
            raise _bad(expr, f"unknown macro; use one of {', '.join(MACROS)}")
        text = macro
    fields = text.split()
    if len(fields) not in (5, 6):
        raise _bad(
            expr,
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with a "
            f"leading seconds field; got {len(fields)}",
        )
    return fields if len(fields) == 6 else ["0", *fields]


def _is_unrestricted(text: str, values: frozenset[int], full: int, other_text: str) -> bool:
    return text in ("*", "?") or (len(values) == full and "*" in other_text)


def _check_fires(expr: str, days: frozenset[int], months: frozenset[int]) -> None:
    if not any(d <= _MAX_DAYS_IN_MONTH[m] for m in months for d in days):
        raise _bad(
            expr,
            "never fires: no listed day-of-month exists in any listed month "
            f"(days {sorted(days)}, months {sorted(months)})",
        )


@lru_cache(maxsize=4096)
def compile_cron(expr: str) -> CronSpec:
    """Parse and validate ``expr``; raises :class:`InvalidSchedule` on ``schedule.cron``."""
    sec, mi, hr, dom_t, mon_t, dow_t = _split(expr)
    # Left to right, so the error names the first bad field the user wrote.
    seconds = _field(expr, _SECOND, sec)
    minutes = _field(expr, _MINUTE, mi)
    hours = _field(expr, _HOUR, hr)
    dom = _field(expr, _DOM, dom_t)
    months = _field(expr, _MONTH, mon_t)
    dow = _field(expr, _DOW, dow_t)
    dom_free = _is_unrestricted(dom_t, dom, 31, dow_t)
    dow_free = _is_unrestricted(dow_t, dow, 7, dom_t)
    if dom_free and dow_free:
        mode = _ANY_DAY
    elif dow_free:
        mode = _DOM_ONLY
        _check_fires(expr, dom, months)
    else:
        mode = _DOW_ONLY if dom_free else _DOM_OR_DOW
    skip = tuple(min((w2 - w) % 7 for w2 in dow) for w in range(7))
    return CronSpec(
        seconds=tuple(sorted(seconds)),
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=tuple(sorted(dom)),
        months=tuple(m in months for m in range(13)),
        weekday_skip=skip,
        day_mode=mode,
    )
