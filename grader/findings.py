"""Findings a free-text answer asserts, with negation scope, and hallucination against the key.

Pure functions, no I/O; nothing here raises on any text.

A finding is one of :data:`FINDINGS` (the benchmark's ``supported_findings`` vocabulary). Each
mention in the text gets a status:

- ``negated``: inside the scope of a negation cue, before it ("no", "not", "without",
  "negative for", "absence of", "free of", "no evidence of", "rules out") or after it
  ("... is absent", "... not seen", "... was ruled out"). A scope ends at a sentence or clause
  break (". ; : ! ?", "but", "however", "although", "except", "apart from", "whereas", "there is")
  or after :data:`SCOPE_WORDS` words, so "no tumor, edema or mass effect" negates all three while
  "no tumor but there is edema" negates only the tumor.
- ``uncertain``: hedged ("possible", "may", "suspicious for", "cannot exclude", "cannot rule
  out", "not ruled out", "cannot be excluded", "questionable"). Pseudo-negations such as
  "cannot exclude" and "not ruled out" contain a negation word but do NOT negate: the finding
  stays open, and the paper (seed 001) counts uncertainty statements as no hallucination.
- ``asserted``: everything else, including pseudo-negations that presuppose the finding
  ("no change in the mass", "no increase in edema", "not only a tumor").

A finding counts once with its strongest status: asserted beats uncertain beats negated.
Laterality findings (``laterality_left`` / ``_right`` / ``_bilateral``) are read only in a
clause that also mentions a pathology, so "the left hemisphere looks normal" asserts nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from benchmark.format import FINDINGS  # the vocabulary labels use; one definition

ASSERTED, UNCERTAIN, NEGATED = "asserted", "uncertain", "negated"
SCOPE_WORDS = 8  # how many words a negation or hedge cue reaches

_PATHOLOGY_PATTERNS: dict[str, str] = {
    # "mass effect" is matched first (longest match wins), so "mass" alone means a tumor.
    "mass_effect": r"mass[\s-]+effects?|midline\s+shift|(?:sulcal|ventricular)\s+effacement"
    r"|effacement|herniation|compression\s+of\s+the\s+(?:lateral\s+)?ventricles?",
    "tumor": r"tumou?rs?|neoplasms?|neoplastic|gliomas?|glioblastomas?|gbm|astrocytomas?"
    r"|meningiomas?|metastas[ie]s|metastatic|malignan(?:cy|cies|t)|cancers?|carcinomas?"
    r"|masse?s?|space[\s-]+occupying",
    "lesion": r"lesions?|abnormalit(?:y|ies)|hyperintensit(?:y|ies)|hypointensit(?:y|ies)"
    r"|hemorrhages?|haemorrhages?|bleeds?|infarcts?|infarctions?|cysts?|cystic|abscess(?:es)?"
    r"|nodules?|pathology|pathologies",
    "edema": r"o?edema(?:tous)?|swelling|vasogenic",
    # "contrast-enhanced T1" names a sequence, not a finding: only "enhancement" / "enhancing".
    "enhancement": r"enhancements?|enhancing",
    "necrosis": r"necros[ie]s|necrotic",
}
_LATERALITY_PATTERNS: dict[str, str] = {
    "laterality_bilateral": r"bilateral(?:ly)?|both\s+(?:sides|hemispheres|cerebral\s+hemispheres)",
    "laterality_left": r"left(?:[\s-]+sided)?",
    "laterality_right": r"right(?:[\s-]+sided)?",
}


def _alternation(patterns: dict[str, str]) -> re.Pattern[str]:
    return re.compile(
        "|".join(
            rf"(?P<{name}>(?<![\w-])(?:{pattern})(?![\w]))" for name, pattern in patterns.items()
        ),
        re.I,
    )


_PATHOLOGY = _alternation(_PATHOLOGY_PATTERNS)
_LATERALITY = _alternation(_LATERALITY_PATTERNS)

# Pseudo-negations: negation words that neither negate nor hedge ("no change in the mass").
_PSEUDO = re.compile(
    r"\b(?:no|not\s+any|without)\s+(?:significant\s+|interval\s+|further\s+)?"
    r"(?:change|increase|decrease|progression|growth|reduction|difference)s?\s+(?:in|of)\b"
    r"|\bnot\s+only\b|\bno\s+doubt\b|\bnot\s+necessarily\b|\bgram[\s-]+negative\b",
    re.I,
)
# Hedges, including the pseudo-negations that leave a finding open.
_HEDGE_BEFORE = re.compile(
    r"\b(?:cannot|can\s*not|can't|could\s+not|unable\s+to)\s+(?:be\s+)?(?:exclude|excluded"
    r"|rule\s+out|ruled\s+out)\b|\bnot\s+(?:be\s+)?(?:excluded|ruled\s+out)\b"
    r"|\b(?:possible|possibly|probable|probably|likely|unlikely|may|might|could|perhaps|maybe"
    r"|suspicious\s+for|suspected|suspect|suggestive\s+of|questionable|equivocal|uncertain"
    r"|unclear|concern\s+for|differential\s+includes|versus|vs\.?|or\s+not|whether|if"
    r"|unsure|not\s+sure|(?:cannot|can\s*not|can't|unable\s+to|not\s+able\s+to)\s+"
    r"(?:\w+\s+)?(?:determine|tell|say|assess|see\s+whether|be\s+sure|confirm))\b",
    re.I,
)
_HEDGE_AFTER = re.compile(
    r"^\W*(?:\w+\s+){0,3}?(?:(?:cannot|can\s*not|can't)\s+be\s+(?:excluded|ruled\s+out)"
    r"|(?:is|are|was|were)?\s*not\s+(?:excluded|ruled\s+out)|(?:is|are)\s+(?:possible|suspected"
    r"|questionable|likely|uncertain|unclear))\b",
    re.I,
)
_NEGATION_BEFORE = re.compile(
    r"\b(?:no|not|never|without|absent|absence\s+of|negative\s+for|free\s+of|rules?\s+out"
    r"|ruled\s+out|excludes?|excluding|denies|neither|nor|lack\s+of|lacks|lacking|none\s+of"
    r"|no\s+evidence\s+of|no\s+signs?\s+of|isn't|aren't|wasn't|weren't|doesn't|don't|didn't"
    r"|cannot\s+see|can't\s+see|do\s+not\s+see|there\s+is\s+no|there\s+are\s+no)\b",
    re.I,
)
_NEGATION_AFTER = re.compile(
    r"^\W*(?:\w+\s+){0,3}?(?:(?:is|are|was|were)\s+)?(?:absent|not\s+(?:seen|present|visible"
    r"|identified|detected|demonstrated|evident|appreciated|noted|shown)|ruled\s+out|excluded"
    r"|none)\b",
    re.I,
)
_TERMINATOR = re.compile(
    r"[.;:!?\n]|\b(?:but|however|although|though|except|apart\s+from|aside\s+from|yet|whereas"
    r"|while|which|(?<!whether\s)(?<!if\s)there\s+(?:is|are)|shows?|showing|demonstrates?"
    r"|reveals?)\b",
    re.I,
)
_WORD = re.compile(r"[\w'-]+")


@dataclass(frozen=True)
class Mention:
    """One finding named in the text, where, and whether it is asserted, uncertain or negated."""

    finding: str
    start: int
    end: int
    status: str


def _scope_before(text: str, start: int) -> str:
    """The words before ``start`` that a cue could reach: back to a terminator, at most N words."""
    head = text[:start]
    cut = 0
    for match in _TERMINATOR.finditer(head):
        cut = match.end()
    words = list(_WORD.finditer(head, cut))
    if len(words) > SCOPE_WORDS:
        cut = words[-SCOPE_WORDS].start()
    return head[cut:]


def _scope_after(text: str, end: int) -> str:
    tail = text[end : end + 200]
    match = _TERMINATOR.search(tail)
    return tail if match is None else tail[: match.start()]


def mention_status(text: str, start: int, end: int) -> str:
    """The status of the words at ``text[start:end]``: asserted, uncertain or negated."""
    before = _PSEUDO.sub(" ", _scope_before(text, start))
    after = _scope_after(text, end)
    if _HEDGE_BEFORE.search(before) or _HEDGE_AFTER.match(after):
        return UNCERTAIN
    if _NEGATION_BEFORE.search(before) or _NEGATION_AFTER.match(after):
        return NEGATED
    return ASSERTED


def _clauses(text: str) -> Iterable[tuple[int, int]]:
    start = 0
    for match in re.finditer(r"[.;!?\n]", text):
        yield start, match.start()
        start = match.end()
    yield start, len(text)


def find_mentions(text: str) -> list[Mention]:
    """Every finding named in ``text``, in order, with its status."""
    text = str(text or "")
    mentions: list[Mention] = []
    for start, end in _clauses(text):
        clause_mentions = [
            Mention(str(m.lastgroup), m.start(), m.end(), mention_status(text, m.start(), m.end()))
            for m in _PATHOLOGY.finditer(text, start, end)
        ]
        if clause_mentions:
            # Laterality only counts next to a pathology it could describe.
            clause_mentions += [
                Mention(
                    str(m.lastgroup), m.start(), m.end(), mention_status(text, m.start(), m.end())
                )
                for m in _LATERALITY.finditer(text, start, end)
            ]
        mentions.extend(sorted(clause_mentions, key=lambda m: m.start))
    return mentions


_RANK = {ASSERTED: 2, UNCERTAIN: 1, NEGATED: 0}


def finding_status(text: str) -> dict[str, str]:
    """Each finding named in ``text`` -> its strongest status (asserted > uncertain > negated)."""
    out: dict[str, str] = {}
    for mention in find_mentions(text):
        old = out.get(mention.finding)
        if old is None or _RANK[mention.status] > _RANK[old]:
            out[mention.finding] = mention.status
    return out


def asserted_findings(text: str) -> tuple[str, ...]:
    """The findings ``text`` asserts, in :data:`FINDINGS` order."""
    status = finding_status(text)
    return tuple(f for f in FINDINGS if status.get(f) == ASSERTED)


def is_hallucination(asserted: Iterable[str], supported: Iterable[str]) -> bool:
    """Whether any asserted finding is one the item's label does not support."""
    return bool(set(asserted) - set(supported))
