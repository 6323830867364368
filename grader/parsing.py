"""Reading a multiple-choice answer and a stated confidence out of a VLM's raw text.

Pure functions, no I/O. ``parse_mc`` never raises on any text and never counts a failure as an
answer: what it cannot read is ``UNPARSEABLE`` with a machine-readable reason, a refusal or
``UNSURE`` is ``ABSTAINED``. It never returns ``TRANSPORT_ERROR``; the grader records that outcome
itself when the gateway logged a timeout or a transport error and there is no text to read.

Where the answer is looked for, first rule that finds one wins:

1. a JSON object with an ``answer`` (or ``choice`` / ``option`` / ``final_answer``) key;
2. an explicit label: the last ``Answer:`` / ``Final answer:`` / ``Choice:`` line (the value may
   sit on the next line), ``<answer>B</answer>`` or ``\\boxed{B}``;
3. a phrase: the last "the answer is B", "the correct option is (B)", "I choose B";
4. lines that are themselves an answer: ``B``, ``(B)``, ``B. sagittal``, ``B) sagittal``; all
   such lines must agree, so an echoed option list is ambiguous rather than read as "A";
5. a refusal anywhere ("UNSURE", "I cannot determine", "not able to assess") -> ``ABSTAINED``;
6. the option text alone, when exactly one option is named (case-insensitive, whole words).

A letter is only read in an answer position (after a label or phrase, or at the start of a line)
and only when what follows it ends the token (punctuation, a bracket, the end, the letter's own
option text, a confidence), so the article in "A T2 image shows..." is not the answer A. Letters
beyond the number of options are invalid. Two different letters asserted together ("A or B",
"A and C") are ``ambiguous_letters``.

``<think>...</think>`` blocks are removed first; so is an unclosed ``<think>`` tail (a reasoning
trace cut off by the token limit) and everything before a lone ``</think>``.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_OPTIONS = len(LETTERS)


class Outcome(enum.StrEnum):
    ANSWERED = "answered"
    ABSTAINED = "abstained"
    UNPARSEABLE = "unparseable"
    TRANSPORT_ERROR = "transport_error"


# Reasons. For ANSWERED the reason names the rule that found the letter, so that an audit can
# tell answers read from a label apart from answers inferred from option text in prose.
REASON_JSON = "json"
REASON_LABEL = "answer_label"
REASON_PHRASE = "answer_phrase"
REASON_LETTER_LINE = "letter_line"
REASON_OPTION_TEXT = "option_text"
REASON_UNSURE = "unsure"
REASON_EMPTY = "empty"
REASON_NO_ANSWER = "no_answer"
REASON_AMBIGUOUS_LETTERS = "ambiguous_letters"
REASON_AMBIGUOUS_OPTIONS = "ambiguous_options"
REASON_INVALID_LETTER = "invalid_letter"


@dataclass(frozen=True)
class ParsedAnswer:
    """What one raw response says.

    ``letter`` is set exactly when ``outcome`` is ANSWERED. ``confidence`` is the stated confidence
    as an integer percent 0..100 whatever the outcome, or None when missing or out of range.
    """

    outcome: Outcome
    letter: str | None
    confidence: int | None
    reason: str

    @property
    def index(self) -> int | None:
        """Zero-based option position of ``letter`` (A -> 0), or None."""
        return None if self.letter is None else LETTERS.index(self.letter)


# ---------------------------------------------------------------------------------------------
# Cleaning

_THINK_TAG = re.compile(r"<(?P<close>/)?think(?:ing)?>", re.I)
_CHAR_MAP = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\uff1a": ":",
        "\uff08": "(",
        "\uff09": ")",
        "\u00a0": " ",
        "*": None,
        "`": None,
        "$": None,
        "\r": None,
    }
)
_LINE_MARKUP = re.compile(r"(?m)^[ \t]*(?:#+|>+|[-\u2022+][ \t])[ \t]*")
_LATEX_TEXT = re.compile(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}")


def _strip_think(text: str) -> str:
    """Drop reasoning blocks in one pass: closed blocks, a lone ``</think>``'s prefix, an open tail."""
    kept: list[str] = []
    start = 0  # start of the text not yet copied
    opened: int | None = None  # where the current block opened
    for tag in _THINK_TAG.finditer(text):
        if tag["close"]:
            if opened is None:
                kept = []  # a lone close: everything before it was reasoning
            else:
                kept.append(text[start:opened])
                kept.append(" ")
            start, opened = tag.end(), None
        elif opened is None:
            opened = tag.start()
    kept.append(text[start:] if opened is None else text[start:opened])
    return "".join(kept)


def _clean(text: str) -> str:
    text = _strip_think(text).translate(_CHAR_MAP).replace("__", "")
    text = _LATEX_TEXT.sub(r"\1", text)
    return _LINE_MARKUP.sub("", text).strip()


# ---------------------------------------------------------------------------------------------
# Refusals

# At the start of an answer value ("Answer: UNSURE", a first line "I cannot determine ...").
_UNSURE_START = re.compile(
    r"^[\W_]*(?:unsure|not\s+sure|uncertain|undetermined|indeterminate|undeterminable"
    r"|cannot\s+(?:be\s+)?determined?|can't\s+(?:be\s+)?determined?|unable\s+to|not\s+able\s+to"
    r"|i\s+(?:cannot|can't|can\s+not|am\s+unable|'m\s+unable|am\s+not\s+able|'m\s+not\s+able"
    r"|do\s+not\s+know|don't\s+know|am\s+not\s+sure|'m\s+not\s+sure))\b",
    re.I,
)
# Anywhere in the text, used only when nothing else was found.
_REFUSAL = re.compile(
    r"\bunsure\b|\bnot\s+sure\b"
    r"|\b(?:cannot|can't|can\s+not|unable\s+to|not\s+able\s+to|impossible\s+to|not\s+possible\s+to)"
    r"\s+(?:\w+\s+){0,2}?(?:determine|assess|tell|identify|answer|evaluate|judge|interpret|say"
    r"|see|provide|make|classify|distinguish|ascertain|confirm)\b"
    r"|\bcannot\s+be\s+(?:\w+\s+)?(?:determined|assessed|identified|evaluated|established"
    r"|ascertained|confirmed)\b"
    r"|\b(?:i\s+am|i'm)\s+(?:unable|not\s+able)\s+to\b|\bi\s+(?:cannot|can't|can\s+not)\b"
    r"|\b(?:do\s+not|don't)\s+know\b|\binsufficient\s+(?:information|detail|evidence)\b",
    re.I,
)


# ---------------------------------------------------------------------------------------------
# Letters in an answer position

# A letter token: "B", "(B)", "[B]", "B)". ASCII only, so case folding cannot produce a
# non-ASCII "letter" (the Kelvin sign folds to k under re.I).
_TOKEN = re.compile(r"\s*(?P<open>[(\[{])?\s*(?P<letter>[A-Za-z])(?:\s*(?P<close>[)\]}]))?", re.A)
_SEP = re.compile(r"\s*(?:,|/|&|\bor\b|\band\b|\bvs\b\.?|\bversus\b)\s*", re.I | re.A)
_SEP_THEN_LETTER = re.compile(
    r"\s*(?:,|/|&|\bor\b|\band\b|\bvs\b\.?|\bversus\b)\s*[(\[]?\s*[A-Za-z]\s*[)\]]?(?![A-Za-z])",
    re.I | re.A,
)
# Characters that close a letter token: "B.", "B,", "B:", "B)", 'B"', "B-", "B/C".
_STRONG_AFTER = frozenset('.,;:!?)]}"-\u2013\u2014/|&')
# Words that may follow a bare letter without making it prose: "B is correct", "A because ...".
_CONTINUATION = frozenset({"is", "seems", "appears", "because", "since", "given", "based", "are"})
_CONFIDENCE_AFTER = re.compile(r"\d+(?:\.\d+)?\s*(?:%|/|percent\b|$|\))|conf", re.I)
_FILLER = re.compile(
    r"^(?:(?:the|option|choice|letter|answer|most|likely|probably|definitely|clearly|correct"
    r"|final|would|be|is)\b\s*:?\s*)+",
    re.I,
)
_OPTION_PREFIX = re.compile(r"^(?:option|choice|letter)\s+(?=[(\[]?[A-Za-z](?![A-Za-z]))", re.I)
_BRACKETED = re.compile(r"[(\[]\s*(?:option\s+|choice\s+)?([A-Z])\s*[)\]]", re.A)
_STANDALONE = re.compile(r"(?<![\w'])([A-Z])(?![\w'-])", re.A)
# How far past a letter token the checks look (enough for a long option text).
_LOOKAHEAD = 400
_CLAUSE_END = re.compile(r"[.;!?](?:\s|$)|,\s|\n")


def _option_pattern(option: str) -> re.Pattern[str] | None:
    words = option.split()
    if not words:
        return None
    return re.compile(r"(?<!\w)" + r"\s+".join(re.escape(w) for w in words) + r"(?!\w)", re.I)


def _starts_with_option(text: str, option: str) -> bool:
    """``text`` opens with ``option`` followed by nothing that continues a phrase."""
    pattern = _option_pattern(option)
    if pattern is None:
        return False
    match = pattern.match(text)
    if match is None:
        return False
    tail = text[match.end() :].lstrip()
    return not tail or not tail[0].isalpha()


def _token_kind(
    letter: str, bracketed: bool, rest: str, options: Sequence[str], strict: bool
) -> str | None:
    """'strong' / 'weak' when the token at this position is an answer letter, else None."""
    if not rest or rest[0] in _STRONG_AFTER:
        return "strong"
    if rest[0] == "'":
        return "strong" if len(rest) == 1 or not rest[1].isalpha() else None
    if bracketed:
        return "strong"
    if not rest[0].isspace():
        return None
    following = rest.lstrip()
    if not following:
        return "strong"
    if _SEP_THEN_LETTER.match(rest):
        return "weak"
    if letter.islower():
        return None
    if following[0] in "([-\u2013\u2014" or _CONFIDENCE_AFTER.match(following):
        return "weak"
    index = LETTERS.index(letter)
    if index < len(options) and _starts_with_option(following, options[index]):
        return "weak"
    first_word = re.match(r"[A-Za-z']+", following)
    if first_word and first_word.group(0).lower() in _CONTINUATION:
        return "weak"
    if not strict and letter not in "AI":
        return "weak"
    return None


def _leading_letters(
    value: str, options: Sequence[str], n_options: int, strict: bool
) -> tuple[list[int], bool] | None:
    """Letters asserted at the start of ``value``: (valid indices, saw an invalid letter)."""
    found: list[int] = []
    invalid = False
    pos = 0
    while True:
        match = _TOKEN.match(value, pos)
        if match is None:
            break
        letter = match["letter"]
        if letter.upper() not in LETTERS:
            break
        bracketed = bool(match["open"] or match["close"])
        rest = value[match.end() : match.end() + _LOOKAHEAD]
        kind = _token_kind(
            letter.upper() if bracketed else letter, bracketed, rest, options, strict
        )
        if kind is None:
            break
        index = LETTERS.index(letter.upper())
        if index < n_options:
            found.append(index)
        elif kind == "strong":
            invalid = True
        pos = match.end()
        separator = _SEP.match(value, pos)
        if separator is None or separator.end() == pos:
            break
        pos = separator.end()
    if not found and not invalid:
        return None
    return found, invalid


def _match_options(text: str, options: Sequence[str], n_options: int) -> set[int]:
    """Options named in ``text`` as whole words; a match inside a longer match is dropped."""
    spans: list[tuple[int, int, int]] = []
    for index in range(n_options):
        pattern = _option_pattern(options[index])
        if pattern is not None:
            spans.extend((m.start(), m.end(), index) for m in pattern.finditer(text))
    if not spans:
        return set()
    spans.sort(key=lambda s: (s[0], -s[1]))
    kept: set[int] = set()
    max_end = -1
    i = 0
    while i < len(spans):
        j = i
        while j < len(spans) and spans[j][:2] == spans[i][:2]:
            j += 1
        if max_end < spans[i][1]:
            kept.update(s[2] for s in spans[i:j])
        max_end = max(max_end, spans[i][1])
        i = j
    return kept


@dataclass(frozen=True)
class _Found:
    outcome: Outcome
    index: int | None
    reason: str


def _from_indices(indices: Sequence[int] | set[int], reason: str, ambiguous: str) -> _Found | None:
    distinct = sorted(set(indices))
    if len(distinct) > 1:
        return _Found(Outcome.UNPARSEABLE, None, ambiguous)
    if distinct:
        return _Found(Outcome.ANSWERED, distinct[0], reason)
    return None


def _interpret_value(
    value: str, options: Sequence[str], n_options: int, strict: bool, reason: str
) -> _Found | None:
    """Read an answer value (what follows "Answer:", or a whole line when ``strict``)."""
    value = value.strip().lstrip("\"'").strip()
    if not value:
        return None
    starts_with_option = any(_starts_with_option(value, options[i]) for i in range(n_options))
    if not starts_with_option and _UNSURE_START.match(value):
        return _Found(Outcome.ABSTAINED, None, REASON_UNSURE)
    body = (_OPTION_PREFIX if strict else _FILLER).sub("", value, count=1)
    letters = _leading_letters(body, options, n_options, strict)
    if letters is not None:
        found, invalid = letters
        result = _from_indices(found, reason, REASON_AMBIGUOUS_LETTERS)
        if result is not None:
            return result
        if invalid and not strict:
            return _Found(Outcome.UNPARSEABLE, None, REASON_INVALID_LETTER)
    if strict:
        return None
    clause = _CLAUSE_END.split(body, maxsplit=1)[0]
    for pattern in (_BRACKETED, _STANDALONE):
        candidates = [LETTERS.index(m.group(1)) for m in pattern.finditer(clause)]
        candidates = [
            i for i in candidates if i < n_options and (pattern is _BRACKETED or i not in (0, 8))
        ]
        result = _from_indices(candidates, reason, REASON_AMBIGUOUS_LETTERS)
        if result is not None:
            return result
    named = _match_options(clause, options, n_options) or _match_options(value, options, n_options)
    result = _from_indices(named, reason, REASON_AMBIGUOUS_OPTIONS)
    if result is not None:
        return result
    if _REFUSAL.search(value):
        return _Found(Outcome.ABSTAINED, None, REASON_UNSURE)
    return None


# ---------------------------------------------------------------------------------------------
# Where answers are written

_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_JSON_ANSWER_KEYS = ("answer", "final_answer", "choice", "option", "selected_option", "letter")
_LABEL = re.compile(
    r"(?<![\w])(?:final\s+|correct\s+|selected\s+)?(?:answer|choice|option)\s*[\"']?\s*"
    r"(?:[:=]|\s[-\u2013\u2014]\s)[ \t]*(?P<value>[^\n]*)",
    re.I,
)
_TAGGED = re.compile(r"<answer>(?P<value>[^<]*)</answer>|\\boxed\{(?P<boxed>[^{}]*)\}", re.I)
_NEXT_LINE = re.compile(r"\s*(?P<line>[^\n]*)")
_PHRASE = re.compile(
    r"(?:\b(?:answer|option|choice)\s+(?:would\s+be|will\s+be|is)"
    r"|\bI\s+(?:would\s+)?(?:choose|select|pick|go\s+with)|\bI'd\s+(?:choose|select|pick|go\s+with))"
    r"\b\s*:?[ \t]*(?P<value>[^\n]*)",
    re.I,
)


def _from_json(text: str, options: Sequence[str], n_options: int) -> _Found | None:
    for match in reversed(list(_JSON_OBJECT.finditer(text))):
        try:
            obj = json.loads(match.group(0))
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        keys = {str(k).lower(): v for k, v in obj.items()}
        for key in _JSON_ANSWER_KEYS:
            value = keys.get(key)
            if value is None or isinstance(value, dict | bool):
                continue
            if isinstance(value, list):
                value = " or ".join(str(v) for v in value)
            found = _interpret_value(str(value), options, n_options, False, REASON_JSON)
            if found is not None:
                return found
    return None


def _label_values(text: str) -> list[tuple[int, str]]:
    """(position, value) of every explicit label; a blank label takes the next non-empty line."""
    values: list[tuple[int, str]] = []
    for match in _LABEL.finditer(text):
        value = match["value"]
        if not value.strip():
            following = _NEXT_LINE.match(text, match.end())
            value = following["line"] if following else ""
        values.append((match.start(), value))
    for match in _TAGGED.finditer(text):
        value = match["value"] if match["value"] is not None else match["boxed"]
        values.append((match.start(), value or ""))
    values.sort(key=lambda v: v[0])
    return values


def _from_lines(text: str, options: Sequence[str], n_options: int) -> _Found | None:
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if not lines:
        return None
    first = _interpret_value(lines[0], options, n_options, True, REASON_LETTER_LINE)
    if first is not None and first.outcome is Outcome.ABSTAINED:
        return first
    indices: list[int] = []
    for line in lines:
        found = _interpret_value(line, options, n_options, True, REASON_LETTER_LINE)
        if found is None or found.outcome is Outcome.ABSTAINED:
            continue
        if found.outcome is Outcome.UNPARSEABLE:
            return found
        assert found.index is not None
        indices.append(found.index)
    return _from_indices(indices, REASON_LETTER_LINE, REASON_AMBIGUOUS_LETTERS)


def _find_answer(text: str, options: Sequence[str], n_options: int) -> _Found:
    found = _from_json(text, options, n_options)
    if found is not None:
        return found
    for _, value in reversed(_label_values(text)):
        found = _interpret_value(value, options, n_options, False, REASON_LABEL)
        if found is not None:
            return found
    for match in reversed(list(_PHRASE.finditer(text))):
        found = _interpret_value(match["value"], options, n_options, False, REASON_PHRASE)
        if found is not None:
            return found
    found = _from_lines(text, options, n_options)
    if found is not None:
        return found
    if _REFUSAL.search(text):
        return _Found(Outcome.ABSTAINED, None, REASON_UNSURE)
    found = _from_indices(
        _match_options(text, options, n_options), REASON_OPTION_TEXT, REASON_AMBIGUOUS_OPTIONS
    )
    if found is not None:
        return found
    return _Found(Outcome.UNPARSEABLE, None, REASON_NO_ANSWER)


def parse_mc(text: str, options: Sequence[str]) -> ParsedAnswer:
    """Read the chosen option letter and the stated confidence from a multiple-choice response.

    ``options`` are the option texts in the order presented (letter A first); only the first 26
    can be named. Never raises for any string.
    """
    n_options = min(len(options), MAX_OPTIONS)
    options = [str(o) for o in options[:n_options]]
    cleaned = _clean(text or "")
    confidence = parse_confidence(cleaned)
    if not cleaned:
        return ParsedAnswer(Outcome.UNPARSEABLE, None, confidence, REASON_EMPTY)
    found = _find_answer(cleaned, options, n_options)
    letter = LETTERS[found.index] if found.index is not None else None
    if found.outcome is not Outcome.ANSWERED or letter is None:
        outcome = Outcome.UNPARSEABLE if found.outcome is Outcome.ANSWERED else found.outcome
        return ParsedAnswer(outcome, None, confidence, found.reason)
    return ParsedAnswer(Outcome.ANSWERED, letter, confidence, found.reason)


# ---------------------------------------------------------------------------------------------
# Confidence

_NUMBER = r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)"
_UNIT = r"%|percent\b|/\s*100\b|/\s*10\b|out\s+of\s+100\b|out\s+of\s+10\b"
_CONF_LABELLED = re.compile(
    r"\bconfidence(?:[\s_]+(?:level|score|rating))?\s*[\"']?\s*"
    r"(?:\([^()\n]{0,30}\)|\d+\s*[-\u2013]\s*\d+(?=\s*[:=]))?\s*"
    r"(?:[:=]|\bis\b|\bof\b|\bat\b)?\s*(?:about|approximately|approx\.?|around|roughly|~)?\s*"
    rf"[\"']?\s*(?P<num>{_NUMBER})(?![\d.]*\w)(?!\s*[-\u2013]\s*\d)\s*(?P<unit>{_UNIT})?"
    rf"|(?<![\w.])(?P<num2>{_NUMBER})\s*(?P<unit2>%|percent\b)\s*(?:confident|confidence|sure|certain)\b",
    re.I,
)
_CONF_UNLABELLED = re.compile(r"(?<![\w.])(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>%|/\s*100\b)")


def _to_percent(number: str, unit: str | None) -> int | None:
    try:
        value = Decimal(number)
    except InvalidOperation:
        return None
    unit = re.sub(r"\s+", "", (unit or "").lower())
    if unit in ("%", "percent", "/100", "outof100"):
        percent = value
    elif unit in ("/10", "outof10"):
        percent = value * 10
    elif "." in number and 0 <= value <= 1:
        percent = value * 100
    else:
        percent = value
    if not 0 <= percent <= 100:
        return None
    return int(percent.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def parse_confidence(text: str) -> int | None:
    """The stated confidence as an integer percent 0..100, or None.

    A value labelled "confidence" wins (the last one when several): "Confidence: 85",
    "confidence 85%", "Confidence: 0.85" (a number with a decimal point <= 1 is a fraction),
    "85/100", JSON ``"confidence": 0.85``, "I am 85% confident". Without a label, a lone
    percentage ("85%" or "85/100", one distinct value in the text) is used. Halves round up;
    a value outside 0..100 gives None.
    """
    if not text:
        return None
    text = _strip_think(text).translate(_CHAR_MAP)
    labelled = list(_CONF_LABELLED.finditer(text))
    if labelled:
        last = labelled[-1]
        if last["num"] is not None:
            return _to_percent(last["num"], last["unit"])
        return _to_percent(last["num2"], last["unit2"])
    values = {_to_percent(m["num"], m["unit"]) for m in _CONF_UNLABELLED.finditer(text)}
    if len(values) == 1:
        return values.pop()
    return None


# ---------------------------------------------------------------------------------------------
# Open-ended answers

REASON_OPEN = "open_text"
REASON_AMBIGUOUS_LABELS = "ambiguous_labels"

_W = r"(?:[\s-]*w(?:eighted|i)?)?"  # "-weighted", "w", "WI"
# Task -> canonical label -> what a model may write for it (regex, case-insensitive, whole words).
# The label text itself always matches too. Where two matches overlap the longer one wins, so
# "T2-FLAIR" is FLAIR and "T1 with gadolinium" is T1ce, not T1.
OPEN_ALIASES: dict[str, dict[str, str]] = {
    "sequence": {
        "T1ce": rf"t1\s*-?\s*(?:ce|c|gd|\+\s*c|\+\s*gd|\+)|t1{_W}[\s,(-]*(?:post[\s-]*(?:contrast"
        r"|gad\w*|gd)|with\s+(?:gadolinium|gad|contrast|gd)|contrast[\s-]*enhanced|after\s+"
        r"(?:contrast|gadolinium)|\+\s*(?:c|gd|contrast))\)?|(?:post[\s-]*(?:contrast|gad\w*)"
        rf"|(?:contrast|gadolinium|gd)[\s-]*enhanced|enhanced)\s+t1{_W}",
        "T1": rf"t1{_W}",
        "T2": rf"t2{_W}",
        "FLAIR": r"(?:t2[\s-]*)?flair|fluid[\s-]*attenuated\s+inversion[\s-]*recovery",
        "PD": rf"pd{_W}|proton[\s-]*density{_W}",
        "MRA": r"mra|mr\s+angiogra\w*|magnetic\s+resonance\s+angiogra\w*|angiogra\w*"
        r"|time[\s-]*of[\s-]*flight|tof",
        "DWI": r"dwi|diffusion(?:[\s-]*weighted)?(?:\s+imaging)?",
    },
    "plane": {
        "axial": r"axial|trans(?:verse|axial)|horizontal",
        "coronal": r"coronal|frontal\s+plane",
        "sagittal": r"(?:mid|para)?[\s-]*sagittal",
    },
    "laterality": {
        "left": r"left(?:[\s-]+(?:hemisphere|side|sided|lobe|cerebral\s+hemisphere))?",
        "right": r"right(?:[\s-]+(?:hemisphere|side|sided|lobe|cerebral\s+hemisphere))?",
        "bilateral": r"bilateral(?:ly)?|both(?:\s+(?:sides|hemispheres))?",
        "none": r"none|neither|no\s+(?:visible\s+)?(?:lesion|tumou?r|mass|laterality|lateralization"
        r"|abnormality)|not\s+applicable|n/a",
    },
}
# Yes/no tasks read a leading yes/no, then what the text asserts about the task's subject.
_YES_NO = re.compile(r"^\W*(?P<word>yes|no)\b", re.I)
_NORMAL = re.compile(r"\b(?:normal|unremarkable|healthy)\b", re.I)
_BRAIN = re.compile(r"\bbrain\b|\bcerebr\w*|\bintracranial\b|\bhead\s+mri\b", re.I)
_NOT_BRAIN = re.compile(
    r"\bnon[\s-]*brain\b|\b(?:noise|random\s+pixels|blank|chest|knee|abdom\w*|pelvi\w*|spine"
    r"|lungs?|heart|cardiac|photograph)\b",
    re.I,
)
_CONFIDENCE_TAIL = re.compile(r"\bconfiden", re.I)


@dataclass(frozen=True)
class ParsedOpen:
    """What one open-ended response says: ``label`` (from the answer space) set iff ANSWERED."""

    outcome: Outcome
    label: str | None
    confidence: int | None
    reason: str


def _label_spans(text: str, task: str, space: dict[str, str]) -> list[tuple[int, int, str]]:
    """(start, end, label) of every label named in ``text``; a match inside a longer one dropped."""
    aliases = OPEN_ALIASES.get(task, {})
    spans: list[tuple[int, int, str]] = []
    for folded, label in space.items():
        pattern = aliases.get(label) or next(
            (p for name, p in aliases.items() if name.casefold() == folded), None
        )
        alternatives = [re.escape(label)] + ([pattern] if pattern else [])
        regex = re.compile(r"(?<![\w+-])(?:" + "|".join(alternatives) + r")(?![\w+])", re.I)
        spans.extend((m.start(), m.end(), label) for m in regex.finditer(text))
    spans.sort(key=lambda s: (s[0], -s[1]))
    kept: list[tuple[int, int, str]] = []
    max_end = -1
    for span in spans:
        if span[1] > max_end and span[0] >= max_end:
            kept.append(span)
        max_end = max(max_end, span[1])
    return kept


def _yes_no(value: str, task: str, space: dict[str, str]) -> set[str]:
    from grader.findings import ASSERTED, NEGATED, finding_status, mention_status

    if "yes" not in space or "no" not in space:
        return set()
    lead = _YES_NO.match(value)
    if lead:
        return {space[lead["word"].lower()]}
    found: set[str] = set()
    if task == "tumor_visible":
        status = {s for f, s in finding_status(value).items() if f in ("tumor", "lesion")}
        if ASSERTED in status:
            found.add("yes")
        elif NEGATED in status or _NORMAL.search(value):
            found.add("no")
    elif task == "is_brain":
        if _NOT_BRAIN.search(value):
            found.add("no")
        for match in _BRAIN.finditer(value):
            negated = mention_status(value, match.start(), match.end()) == NEGATED
            found.add("no" if negated else "yes")
    return {space[f] for f in found}


def _open_labels(value: str, task: str, space: dict[str, str]) -> set[str]:
    """The labels ``value`` asserts: named and not negated ("not coronal but axial" -> axial)."""
    from grader.findings import NEGATED, mention_status

    found = _yes_no(value, task, space)
    if found:
        return found
    labels = set()
    for start, end, label in _label_spans(value, task, space):
        if label.casefold() in ("yes", "no") or mention_status(value, start, end) != NEGATED:
            labels.add(label)
    return labels


def _open_values(text: str) -> list[str]:
    """Where an open answer may be written: a JSON answer, the last answer label, the text."""
    values: list[str] = []
    for match in reversed(list(_JSON_OBJECT.finditer(text))):
        try:
            obj = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(obj, dict):
            keys = {str(k).lower(): v for k, v in obj.items()}
            values += [str(keys[k]) for k in _JSON_ANSWER_KEYS if isinstance(keys.get(k), str)]
    labelled = _label_values(text)
    if labelled:
        values.append(labelled[-1][1])
    values.append(text)
    out = []
    for value in values:
        head = _CONFIDENCE_TAIL.split(value, maxsplit=1)[0]
        out.append(head if head.strip() else value)
    return out


def parse_open(text: str, answer_space: Sequence[str], task: str) -> ParsedOpen:
    """Read an open-ended answer and normalise it to a label of ``answer_space``.

    Aliases per task (:data:`OPEN_ALIASES`): "T1-weighted" / "T1w" -> T1, "post-contrast T1" /
    "T1 with gadolinium" -> T1ce, "transverse" -> axial, "left hemisphere" -> left, "both sides"
    -> bilateral; yes/no tasks read a leading yes/no, then whether the text asserts or negates
    the subject ("no tumour", "normal" -> no for tumor_visible; "not a brain MRI" -> no for
    is_brain). Negated labels are dropped ("not coronal but axial" -> axial). The first place
    that names exactly one label wins (a JSON answer, the last "Answer:" value, the whole text);
    two different labels are ``ambiguous_labels``; a refusal or UNSURE is ABSTAINED; nothing is
    ``no_answer``. Never raises for any string.
    """
    space = {str(label).casefold(): str(label) for label in answer_space if str(label).strip()}
    cleaned = _clean(text or "")
    confidence = parse_confidence(cleaned)
    if not cleaned:
        return ParsedOpen(Outcome.UNPARSEABLE, None, confidence, REASON_EMPTY)
    for value in _open_values(cleaned):
        stripped = value.strip()
        if _UNSURE_START.match(stripped) and not _label_spans(stripped[:40], task, space):
            return ParsedOpen(Outcome.ABSTAINED, None, confidence, REASON_UNSURE)
        labels = _open_labels(stripped, task, space)
        if len(labels) > 1:
            return ParsedOpen(Outcome.UNPARSEABLE, None, confidence, REASON_AMBIGUOUS_LABELS)
        if labels:
            return ParsedOpen(Outcome.ANSWERED, labels.pop(), confidence, REASON_OPEN)
    if _REFUSAL.search(cleaned) or _only_hedged(cleaned, task):
        return ParsedOpen(Outcome.ABSTAINED, None, confidence, REASON_UNSURE)
    return ParsedOpen(Outcome.UNPARSEABLE, None, confidence, REASON_NO_ANSWER)


def _only_hedged(text: str, task: str) -> bool:
    """A tumour question answered only with hedges ("a tumour cannot be excluded")."""
    from grader.findings import UNCERTAIN, finding_status

    return task == "tumor_visible" and UNCERTAIN in finding_status(text).values()


def clean_text(text: str) -> str:
    """``text`` without reasoning blocks and markdown, as the parsers read it."""
    return _clean(text or "")
