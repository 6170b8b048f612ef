"""B9's corpus: long English-like prose and long code-like text from a seed.

Everything is generated here from word lists written for this file (no upstream text).
A prompt is one long string; a set is a list of prompts. set_texts(kind, seed, index, n)
gives the same strings on every machine, so both tokenizers read the same bytes.
"""

import random

# Grammar classes; coined words (syllables below) keep a cold pass from seeing only
# the few thousand words a cache would hold after one page.
DET = "the a this that every each some no another our their its my your one".split()
ADJ = """quiet early bright narrow heavy careful sudden distant plain honest broken
silver ancient patient curious hollow gentle bitter rapid steady wooden
frozen humble clever restless vivid modest shallow rough tender formal
loose hidden crowded empty golden warm cold dark pale loud brief strange
familiar serious simple common rare local foreign public private central
""".split()
NOUN = """river window market letter garden engine village teacher morning harbor
question mountain kitchen journey report evening bridge forest station
record machine office valley island meeting lantern answer doctor season
stone ladder sister painter pocket signal program document camera library
theory message border winter surface number planet council result method
figure account reason memory picture member request version problem
""".split()
VERB = """carried opened watched followed noticed answered covered remembered
described measured crossed reached gathered repaired explained ordered
collected finished visited wanted moved pushed turned shared counted
built found kept held brought left told wrote took gave made read sent
""".split()
ADV = """slowly quickly quietly rarely nearly simply openly gently firmly
finally suddenly carefully easily clearly mostly hardly barely often
""".split()
PREP = "in on under over near behind across through beside along toward against into from".split()
CONJ = "and but so yet because although while when after before until since".split()
NAMES = "Marta Oskar Lena Tomas Ines Viktor Nadia Henrik Sofia Pavel Clara Emil".split()
PLACES = "Norwick Valdera Osterby Calmont Riverside Brennfeld Lowmarsh Tarin".split()
SYLL = """ka lo mi ren tor vel sa bri dun fel gor han is jul ke lum mar nor ob
pra qui ros sten tu ur vin wal xe yor zan ath bel cor dra eth fin""".split()
QUOTE_PAIRS = [('"', '"'), ("\u201c", "\u201d"), ("(", ")"), ("'", "'")]

KEYWORDS_PY = ["def", "return", "if", "elif", "else", "for", "while", "in", "not", "and",
               "or", "import", "from", "class", "with", "as", "try", "except", "yield"]
TYPES_C = ["int", "size_t", "uint32_t", "double", "char *", "const char *", "bool", "void"]
OPS = ["+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "==", "!=", "<=", ">=", "<", ">"]


def coined(rng):
    return "".join(rng.choice(SYLL) for _ in range(rng.randint(2, 4)))


def noun_phrase(rng):
    words = [rng.choice(DET)]
    if rng.random() < 0.5:
        words.append(rng.choice(ADJ))
    r = rng.random()
    words.append(coined(rng) if r < 0.12 else rng.choice(NAMES + PLACES) if r < 0.2
                 else rng.choice(NOUN) + ("s" if rng.random() < 0.2 else ""))
    return words


def sentence(rng):
    words = noun_phrase(rng)
    if rng.random() < 0.3:
        words.append(rng.choice(ADV))
    words.append(rng.choice(VERB))
    words += noun_phrase(rng)
    for _ in range(rng.randint(0, 3)):
        r = rng.random()
        if r < 0.45:
            words += [rng.choice(PREP)] + noun_phrase(rng)
        elif r < 0.75:
            words[-1] += ","
            words += [rng.choice(CONJ)] + noun_phrase(rng) + [rng.choice(VERB)]
        elif r < 0.85:
            words += ["in", str(rng.randint(1890, 2030))]
        else:
            words += [f"{rng.randint(2, 999)}", rng.choice(NOUN) + "s"]
    if rng.random() < 0.1:
        o, c = rng.choice(QUOTE_PAIRS)
        i = rng.randrange(len(words))
        words[i] = o + words[i] + c
    if rng.random() < 0.08:
        words.insert(rng.randrange(1, len(words)), "\u2014")
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", ".", "!", "?", ";", ":"])


def prose(rng, chars):
    out, n = [], 0
    while n < chars:
        para = " ".join(sentence(rng) for _ in range(rng.randint(3, 9)))
        out.append(para)
        n += len(para) + 2
    return "\n\n".join(out)


def ident(rng, style):
    parts = [rng.choice(NOUN + ADJ + VERB) if rng.random() < 0.7 else coined(rng)
             for _ in range(rng.randint(1, 3))]
    if style == "camel":
        return parts[0] + "".join(p.capitalize() for p in parts[1:])
    return "_".join(parts)


def expr(rng, names):
    terms = [rng.choice(names) if rng.random() < 0.6 else str(rng.randint(0, 4096))
             for _ in range(rng.randint(1, 4))]
    e = terms[0]
    for t in terms[1:]:
        e += f" {rng.choice(OPS)} {t}"
    return e


def py_function(rng):
    name = ident(rng, "snake")
    args = [ident(rng, "snake") for _ in range(rng.randint(0, 4))]
    lines = [f"def {name}({', '.join(args)}):",
             f'    """{" ".join(sentence(rng).split()[:rng.randint(4, 12)])}"""']
    names, depth = args + ["self", "result"], 1
    for _ in range(rng.randint(4, 18)):
        pad = "    " * depth
        r = rng.random()
        if r < 0.35:
            v = ident(rng, "snake")
            names.append(v)
            lines.append(f"{pad}{v} = {expr(rng, names)}")
        elif r < 0.5 and depth < 4:
            lines.append(f"{pad}for {rng.choice(names)} in range({rng.randint(1, 64)}):")
            depth += 1
        elif r < 0.65 and depth < 4:
            lines.append(f"{pad}if {expr(rng, names)}:")
            depth += 1
        elif r < 0.75:
            lines.append(f"{pad}# {sentence(rng).lower()}")
        elif r < 0.85:
            lines.append(f'{pad}log.info("{ident(rng, "snake")}: %s", {rng.choice(names)})')
        else:
            lines.append(f"{pad}{rng.choice(names)}.{ident(rng, 'snake')}({expr(rng, names)})")
            if depth > 1 and rng.random() < 0.5:
                depth -= 1
    lines.append(f"    return {expr(rng, names)}")
    return "\n".join(lines) + "\n"


def c_function(rng):
    name = ident(rng, "snake")
    args = [f"{rng.choice(TYPES_C)} {ident(rng, 'snake')}" for _ in range(rng.randint(1, 4))]
    names = [a.split()[-1] for a in args]
    lines = [f"/* {sentence(rng)} */", f"static {rng.choice(TYPES_C)} {name}({', '.join(args)})",
             "{"]
    depth = 1
    for _ in range(rng.randint(4, 18)):
        pad = "\t" * depth
        r = rng.random()
        if r < 0.35:
            v = ident(rng, "camel")
            names.append(v)
            lines.append(f"{pad}{rng.choice(TYPES_C)} {v} = {expr(rng, names)};")
        elif r < 0.5 and depth < 4:
            i = rng.choice("ijk")
            lines.append(f"{pad}for (size_t {i} = 0; {i} < {rng.choice(names)}; {i}++) {{")
            depth += 1
        elif r < 0.65 and depth < 4:
            lines.append(f"{pad}if ({expr(rng, names)}) {{")
            depth += 1
        elif r < 0.8:
            lines.append(f'{pad}fprintf(stderr, "{ident(rng, "snake")}: %d\\n", {rng.choice(names)});')
        else:
            lines.append(f"{pad}{rng.choice(names)}[{rng.randint(0, 255)}] = 0x{rng.randint(0, 65535):04x};")
            if depth > 1:
                depth -= 1
                lines.append("\t" * depth + "}")
    while depth > 1:
        depth -= 1
        lines.append("\t" * depth + "}")
    lines += [f"\treturn {expr(rng, names)};", "}"]
    return "\n".join(lines) + "\n"


def code(rng, chars):
    out, n = [], 0
    while n < chars:
        f = py_function(rng) if rng.random() < 0.5 else c_function(rng)
        out.append(f)
        n += len(f) + 1
    return "\n".join(out)


# Character ranges per prompt: about 2k-8k tokens on the vocabularies B9 runs.
SIZES = {"prose": (9000, 34000), "code": (7000, 26000)}


def set_texts(kind, seed, index, n):
    """<n> prompts of <kind> ("prose" or "code"), set <index> of <seed>."""
    rng = random.Random(f"{seed}/{kind}/{index}")
    lo, hi = SIZES[kind]
    make = prose if kind == "prose" else code
    return [make(rng, rng.randint(lo, hi)) for _ in range(n)]
