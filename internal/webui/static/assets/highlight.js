// Syntax colouring for the languages workers write most: one tokenizer
// per family (comments, strings, numbers, keywords), emitting text nodes
// inside spans with classes. Unknown languages come back as plain text.

import { h } from './dom.js';

const kw = (s) => new Set(s.split(' '));

const langs = {
  python: { line: '#', strings: ['"""', "'''", '"', "'"], keywords: kw('and as assert async await break class continue def del elif else except finally for from global if import in is lambda None nonlocal not or pass raise return True False try while with yield match case self print') },
  shell: { line: '#', strings: ['"', "'"], keywords: kw('if then else elif fi for while until do done case esac in function return local export set echo exit cd source readonly shift trap') },
  js: { line: '//', block: ['/*', '*/'], strings: ['"', "'", '`'], keywords: kw('async await break case catch class const continue default delete do else export extends false finally for from function if import in instanceof let new null return static super switch this throw true try typeof undefined var void while yield interface type enum implements') },
  go: { line: '//', block: ['/*', '*/'], strings: ['"', '`', "'"], keywords: kw('break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var nil true false error string int int64 bool byte rune any') },
  rust: { line: '//', block: ['/*', '*/'], strings: ['"'], keywords: kw('as async await break const continue crate else enum extern false fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait true type unsafe use where while Some None Ok Err') },
  c: { line: '//', block: ['/*', '*/'], strings: ['"', "'"], keywords: kw('auto break case char const continue default do double else enum extern float for goto if int long register return short signed sizeof static struct switch typedef union unsigned void volatile while class public private protected new this throw try catch import package boolean true false null final') },
  ruby: { line: '#', strings: ['"', "'"], keywords: kw('begin break case class def do else elsif end ensure false for if in module next nil not or redo rescue retry return self super then true undef unless until when while yield require puts') },
  sql: { line: '--', block: ['/*', '*/'], strings: ["'", '"'], keywords: kw('select from where and or not insert into values update set delete create table drop alter index join left right inner outer on group by order having limit as distinct union null is in like SELECT FROM WHERE AND OR NOT INSERT INTO VALUES UPDATE SET DELETE CREATE TABLE DROP JOIN ON GROUP BY ORDER LIMIT AS NULL') },
  json: { strings: ['"'], keywords: kw('true false null') },
  yaml: { line: '#', strings: ['"', "'"], keywords: kw('true false null yes no') },
  css: { block: ['/*', '*/'], strings: ['"', "'"], keywords: kw('') },
  markup: { block: ['<!--', '-->'], strings: ['"', "'"], keywords: kw(''), tags: true },
};

const aliases = {
  py: 'python', python: 'python', sh: 'shell', bash: 'shell', shell: 'shell', zsh: 'shell',
  js: 'js', mjs: 'js', javascript: 'js', ts: 'js', tsx: 'js', jsx: 'js', typescript: 'js',
  go: 'go', rs: 'rust', rust: 'rust', c: 'c', h: 'c', cpp: 'c', cc: 'c', java: 'c', cs: 'c', kt: 'c',
  rb: 'ruby', ruby: 'ruby', sql: 'sql', json: 'json', jsonl: 'json', yaml: 'yaml', yml: 'yaml', toml: 'yaml',
  css: 'css', html: 'markup', htm: 'markup', xml: 'markup', svg: 'markup',
};

// languageOf names the language of a file name or a fence's info string.
export function languageOf(nameOrLang) {
  const s = String(nameOrLang || '').toLowerCase();
  const ext = s.includes('.') ? s.slice(s.lastIndexOf('.') + 1) : s;
  return aliases[ext] || '';
}

// highlight returns nodes for code in lang (a name, an extension or a
// fence's language).
export function highlight(code, lang) {
  const spec = langs[languageOf(lang)];
  if (!spec) return [code];
  const out = [];
  let plain = '';
  const flush = () => { if (plain) { pushWords(out, plain, spec); plain = ''; } };
  let i = 0;
  while (i < code.length) {
    const rest = code.startsWith.bind(code);
    if (spec.line && rest(spec.line, i)) {
      const end = code.indexOf('\n', i);
      const j = end < 0 ? code.length : end;
      flush(); out.push(h('span', { class: 'tok-com' }, code.slice(i, j))); i = j; continue;
    }
    if (spec.block && rest(spec.block[0], i)) {
      const end = code.indexOf(spec.block[1], i + spec.block[0].length);
      const j = end < 0 ? code.length : end + spec.block[1].length;
      flush(); out.push(h('span', { class: 'tok-com' }, code.slice(i, j))); i = j; continue;
    }
    const q = spec.strings.find((s) => rest(s, i));
    if (q) {
      let j = i + q.length;
      while (j < code.length && !code.startsWith(q, j)) {
        if (code[j] === '\\') j++;
        if (q.length === 1 && q !== '`' && code[j] === '\n') break;
        j++;
      }
      j = Math.min(code.length, j + q.length);
      flush(); out.push(h('span', { class: 'tok-str' }, code.slice(i, j))); i = j; continue;
    }
    if (spec.tags && code[i] === '<') {
      const m = code.slice(i).match(/^<\/?[A-Za-z][\w:-]*/);
      if (m) { flush(); out.push(h('span', { class: 'tok-kw' }, m[0])); i += m[0].length; continue; }
    }
    plain += code[i++];
  }
  flush();
  return out;
}

// pushWords colours the keywords and numbers of a plain run.
function pushWords(out, text, spec) {
  const re = /\b(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|0x[0-9a-fA-F]+)\b|[A-Za-z_][\w]*/g;
  let last = 0;
  for (const m of text.matchAll(re)) {
    const isNum = m[1] !== undefined;
    if (!isNum && !spec.keywords.has(m[0])) continue;
    if (m.index > last) out.push(text.slice(last, m.index));
    out.push(h('span', { class: isNum ? 'tok-num' : 'tok-kw' }, m[0]));
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
}
