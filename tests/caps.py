#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# The tree's caps on size, checked: no source file over 900 lines, no
# function over 100.  A function counts from the line of its name (GNU
# style puts the return type on the line before, the name at the start
# of the next) to its closing brace, both included.
#
# Functions are found in the C text with its comments, strings,
# character constants and preprocessor lines blanked out (the lines
# kept): a brace at file level opens a function's body where the text
# before it since the last declaration ends in ")" (or an attribute
# macro's ")") and assigns nothing.  Braces that do not balance (an
# #if giving a body two openings) are an error, never a guess.
#
# Usage: caps.py [--file-max=N] [--function-max=N] FILE...
# Each file or function over its cap is printed; the exit status says
# if any (2: a file could not be read as C).

import re
import sys

IDENT = re.compile(r'[A-Za-z_]\w*')


def blank(text):
    """text with comments, strings, character constants and
    preprocessor lines turned to spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in ' \t':
            out.append(c)
            i += 1
            continue
        if line_start and c == '#':
            # A directive, with its continuation lines.
            while i < n and text[i] != '\n':
                if text[i] == '\\' and i + 1 < n and text[i + 1] == '\n':
                    out.append(' \n')
                    i += 2
                    continue
                if text.startswith('/*', i):
                    end = text.find('*/', i + 2)
                    end = n if end < 0 else end + 2
                    out.append(re.sub(r'[^\n]', ' ', text[i:end]))
                    i = end
                    continue
                out.append(' ')
                i += 1
            continue
        line_start = c == '\n'
        if text.startswith('/*', i):
            end = text.find('*/', i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:end]))
            i = end
        elif text.startswith('//', i):
            end = text.find('\n', i)
            end = n if end < 0 else end
            out.append(' ' * (end - i))
            i = end
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r'[^\n]', ' ', text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def functions(text):
    """(name, first line, last line) of each function defined in text;
    raises ValueError where the braces do not balance."""
    code = blank(text)
    found = []
    depth = paren = 0
    chunk_start = 0             # the text since the last declaration
    body = None                 # (name, line) of the function being read
    line = 1
    for i, c in enumerate(code):
        if c == '\n':
            line += 1
        elif c == '(':
            paren += 1
        elif c == ')':
            paren -= 1
        elif c == '{':
            if depth == 0:
                body = head(code, chunk_start, i)
            depth += 1
        elif c == '}':
            depth -= 1
            if depth < 0:
                raise ValueError('line %d: a } closes nothing' % line)
            if depth == 0:
                if body:
                    found.append((body[0], body[1], line))
                body = None
                chunk_start = i + 1
        elif c == ';' and depth == 0 and paren == 0:
            chunk_start = i + 1
    if depth or paren:
        raise ValueError('the braces or parentheses do not balance')
    return found


def strip_attributes(text):
    """text without the attribute macros that may follow a function's
    parameters (TSA_REQUIRES (img->lock), TSA_NO_TSA, __attribute__
    ((x))): upper-case names, each perhaps with its arguments."""
    t = text.rstrip()
    while True:
        end = len(t)
        if t.endswith(')'):
            depth, i = 0, end - 1
            while i >= 0:
                depth += {')': 1, '(': -1}.get(t[i], 0)
                if depth == 0:
                    break
                i -= 1
            m = re.search(r'(?:\b[A-Z_][A-Z0-9_]*|__attribute__)\s*$',
                          t[:max(i, 0)])
            if i < 0 or not m:
                return t
            rest = t[:m.start()].rstrip()
        else:
            m = re.search(r'\b[A-Z_][A-Z0-9_]*$', t)
            if not m:
                return t
            rest = t[:m.start()].rstrip()
        if not rest.endswith(')'):
            return t
        t = rest


def head(code, start, brace):
    """(name, line) if the text code[start:brace] is a function's head,
    else None."""
    text = code[start:brace]
    if not strip_attributes(text).endswith(')'):
        return None             # a struct, union or enum, or an initializer
    # The top-level parenthesised groups: the first preceded by an
    # identifier at the start of a line is the name's (GNU style), else
    # the first preceded by one at all.
    depth, groups = 0, []
    for i, c in enumerate(text):
        if c == '(':
            if depth == 0:
                groups.append(i)
            depth += 1
        elif c == ')':
            depth -= 1
        elif c == '=' and depth == 0:
            return None         # an initializer
    best = None
    for g in groups:
        m = re.search(r'([A-Za-z_]\w*)\s*$', text[:g])
        if not m:
            continue
        at = m.start(1)
        at_col0 = at == 0 or text[at - 1] == '\n'
        if at_col0 or best is None:
            best = (m.group(1), at)
            if at_col0:
                break
    if best is None:
        return None
    before = code[:start + best[1]]
    return best[0], before.count('\n') + 1


def main(argv):
    file_max, function_max, paths = 900, 100, []
    for arg in argv:
        m = re.match(r'^--(file|function)-max=(\d+)$', arg)
        if m and m.group(1) == 'file':
            file_max = int(m.group(2))
        elif m:
            function_max = int(m.group(2))
        else:
            paths.append(arg)
    over = nfuncs = 0
    for path in paths:
        text = open(path, encoding='utf-8', errors='replace').read()
        nlines = text.count('\n') + (0 if text.endswith('\n') or not text
                                     else 1)
        if nlines > file_max:
            print('%s: %d lines (at most %d)' % (path, nlines, file_max))
            over += 1
        try:
            funcs = functions(text)
        except ValueError as e:
            print('%s: cannot be read as C: %s' % (path, e))
            return 2
        nfuncs += len(funcs)
        for name, first, last in funcs:
            if last - first + 1 > function_max:
                print('%s:%d: %s is %d lines (at most %d)'
                      % (path, first, name, last - first + 1, function_max))
                over += 1
    print('%d files, %d functions: %d over their caps' % (len(paths), nfuncs,
                                                          over))
    return 1 if over else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
