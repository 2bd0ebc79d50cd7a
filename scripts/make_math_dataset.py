#!/usr/bin/python3
"""Writes the math word-problem dataset that ships with rlx (examples/data/math_word_*.jsonl).

Multi-step word problems (two to four operations) whose answers take the forms the `math`
environment's checker handles: integers (some with thousands separators), fractions
(`3/4`, `\\frac{3}{4}`), decimals, money, and MATH-style solutions ending in `\\boxed{...}`.
The lines use the three task formats of docs/MATH.md: GSM8K ({"question", "answer": "... #### 72"}),
MATH ({"problem", "solution": "... \\boxed{...}"}) and MATH-500 ({"problem", "answer"}).
The validation split is drawn from another seed and shares no problem text with training.

    scripts/make_math_dataset.py                    # examples/data/math_word_{train,val}.jsonl
    scripts/make_math_dataset.py --train 5000 --val 500 --out DIR
"""
import argparse
import json
import pathlib
import random
import sys
from fractions import Fraction

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Mateo", "Nia"]
ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells"]


def frac_text(f: Fraction, latex: bool) -> str:
    if f.denominator == 1:
        return str(f.numerator)
    return f"\\frac{{{f.numerator}}}{{{f.denominator}}}" if latex else f"{f.numerator}/{f.denominator}"


def money(x: Fraction) -> str:
    return f"{float(x):.2f}"


def p_collect(r):  # integer: add, multiply, subtract
    n, item = r.choice(NAMES), r.choice(ITEMS)
    a, b, c, d = r.randint(3, 40), r.randint(2, 9), r.randint(3, 25), r.randint(1, 30)
    total = a + b * c - d
    q = (f"{n} has {a} {item}. {n} buys {b} packs with {c} {item} in each pack, then gives {d} {item} to a friend. "
         f"How many {item} does {n} have now?")
    steps = [f"The packs hold {b} * {c} = {b * c} {item}.", f"{a} + {b * c} = {a + b * c}.",
             f"After giving {d} away: {a + b * c} - {d} = {total}."]
    return q, steps, str(total)


def p_slices(r):  # fraction left
    n = r.choice(NAMES)
    slices = r.choice([6, 8, 10, 12, 16, 20, 24])
    a = r.randint(1, slices // 3)
    b = r.randint(1, slices // 3)
    left = Fraction(slices - a - b, slices)
    q = (f"A pizza is cut into {slices} equal slices. {n} eats {a} slices and a friend eats {b} slices. "
         "What fraction of the pizza is left? Give the fraction in lowest terms.")
    steps = [f"{a} + {b} = {a + b} slices are eaten.", f"{slices} - {a + b} = {slices - a - b} slices are left.",
             f"The fraction left is {slices - a - b}/{slices} = {left.numerator}/{left.denominator}."]
    return q, steps, frac_text(left, latex=r.random() < 0.5)


def p_change(r):  # decimals: money
    n = r.choice(NAMES)
    p = Fraction(r.randint(105, 899), 100)
    s = Fraction(r.randint(35, 299), 100)
    m, k = r.randint(2, 5), r.randint(1, 6)
    cost = m * p + k * s
    bill = 20 if cost < 20 else 50 if cost < 50 else 100
    change = bill - cost
    q = (f"A notebook costs ${money(p)} and a pen costs ${money(s)}. {n} buys {m} notebooks and {k} pen{'s' if k > 1 else ''} and pays "
         f"with a ${bill} bill. How many dollars of change does {n} get?")
    steps = [f"Notebooks: {m} * {money(p)} = {money(m * p)}.", f"Pens: {k} * {money(s)} = {money(k * s)}.",
             f"Total {money(cost)}; change {bill} - {money(cost)} = {money(change)}."]
    return q, steps, money(change)


def p_discount(r):  # percent, then a quantity
    price = r.choice([20, 25, 40, 50, 60, 80, 120, 150, 200])
    pct = r.choice([10, 15, 20, 25, 30, 40, 50])
    k = r.randint(2, 6)
    each = Fraction(price * (100 - pct), 100)
    total = k * each
    q = (f"A jacket costs ${price}. During a sale its price is reduced by {pct}%. "
         f"How many dollars do {k} jackets cost at the sale price?")
    steps = [f"The discount is {pct}% of {price} = {frac_text(Fraction(price * pct, 100), False)}.",
             f"Each jacket costs {frac_text(each, False)}.", f"{k} jackets cost {frac_text(total, False)}."]
    ans = str(total.numerator) if total.denominator == 1 else f"{float(total):g}"
    return q, steps, ans


def p_speed(r):  # average speed: a fraction or an integer
    d1, t1 = r.randint(20, 200), r.randint(1, 4)
    d2, t2 = r.randint(20, 200), r.randint(1, 4)
    v = Fraction(d1 + d2, t1 + t2)
    q = (f"A train travels {d1} km in {t1} hours and then {d2} km in {t2} hours. What is its average speed, in km "
         "per hour, over the whole trip?")
    steps = [f"Distance {d1} + {d2} = {d1 + d2} km.", f"Time {t1} + {t2} = {t1 + t2} hours.",
             f"Average speed {d1 + d2}/{t1 + t2} = {frac_text(v, False)} km/h."]
    return q, steps, frac_text(v, latex=r.random() < 0.5)


def p_ratio(r):  # ratio, then a difference
    a, b = r.randint(1, 7), r.randint(1, 7)
    while a == b:
        b = r.randint(1, 7)
    unit = r.randint(3, 40)
    total = (a + b) * unit
    q = (f"In a school club the ratio of girls to boys is {a}:{b}. There are {total:,} members in all. "
         "How many more girls than boys are there? (If there are more boys, the answer is negative.)")
    steps = [f"One part is {total}/{a + b} = {unit} members.", f"Girls {a * unit}, boys {b * unit}.",
             f"The difference is {a * unit} - {b * unit} = {(a - b) * unit}."]
    return q, steps, str((a - b) * unit)


def p_savings(r):  # large integers with thousands separators
    n = r.choice(NAMES)
    w, weeks, spend = r.randint(150, 900), r.randint(8, 52), r.randint(200, 3000)
    total = w * weeks - spend
    q = (f"{n} saves ${w} every week for {weeks} weeks and then spends ${spend:,} on a bicycle. "
         f"How many dollars does {n} have left?")
    steps = [f"Saved {w} * {weeks} = {w * weeks:,}.", f"Left {w * weeks:,} - {spend:,} = {total:,}."]
    return q, steps, f"{total:,}" if r.random() < 0.5 else str(total)


PROBLEMS = [p_collect, p_slices, p_change, p_discount, p_speed, p_ratio, p_savings]


def record(r, q, steps, ans):
    form = r.randrange(3)
    if form == 0:  # GSM8K
        return {"question": q, "answer": " ".join(steps) + f"\n#### {ans}"}
    if form == 1:  # MATH: the solution's last \boxed{}
        return {"problem": q, "solution": " ".join(steps) + f" The answer is $\\boxed{{{ans}}}$."}
    return {"problem": q, "answer": ans}  # MATH-500 / DAPO: the answer itself


def split(seed, count, taken):
    r = random.Random(seed)
    out = []
    while len(out) < count:
        q, steps, ans = r.choice(PROBLEMS)(r)
        if q in taken:
            continue
        taken.add(q)
        out.append(record(r, q, steps, ans))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = pathlib.Path(__file__).resolve().parent.parent
    ap.add_argument("--out", type=pathlib.Path, default=here / "examples" / "data")
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--val", type=int, default=200)
    ap.add_argument("--seed", type=int, default=52)
    a = ap.parse_args()
    taken = set()
    val = split(a.seed + 1, a.val, taken)  # first, so training never holds a validation problem
    train = split(a.seed, a.train, taken)
    a.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("math_word_train.jsonl", train), ("math_word_val.jsonl", val)):
        with open(a.out / name, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"{a.out / name}: {len(rows)} problems", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
