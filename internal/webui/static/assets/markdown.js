// A small Markdown renderer that builds DOM nodes: headings, paragraphs,
// emphasis, inline code, fenced code (coloured), lists, block quotes,
// rules, tables and links. Raw HTML is shown as the text it is, links keep
// only http(s) and mailto targets, and images are not loaded (a worker's
// Markdown could otherwise make the browser call any host): each becomes a
// link saying it is an image.

import { h, safeHref } from './dom.js';
import { highlight } from './highlight.js';

export function renderMarkdown(src) {
  const root = h('div', { class: 'markdown' });
  const lines = String(src).replace(/\r\n?/g, '\n').split('\n');
  blocks(lines, root);
  return root;
}

const fenceRe = /^\s{0,3}(```+|~~~+)\s*([\w+#.-]*)/;
const headingRe = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const ruleRe = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const bulletRe = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const quoteRe = /^\s{0,3}>\s?(.*)$/;
const tableSepRe = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function blocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    let m;
    if ((m = line.match(fenceRe))) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence)) body.push(lines[i++]);
      i++;
      parent.append(h('pre', { class: 'code' }, highlight(body.join('\n'), m[2])));
      continue;
    }
    if ((m = line.match(headingRe))) {
      parent.append(h('h' + m[1].length, {}, inline(m[2])));
      i++;
      continue;
    }
    if (ruleRe.test(line)) { parent.append(h('hr')); i++; continue; }
    if (quoteRe.test(line)) {
      const body = [];
      while (i < lines.length && (m = lines[i].match(quoteRe))) { body.push(m[1]); i++; }
      const q = h('blockquote');
      blocks(body, q);
      parent.append(q);
      continue;
    }
    if (line.includes('|') && i + 1 < lines.length && tableSepRe.test(lines[i + 1])) {
      const rows = [];
      rows.push(cells(line));
      i += 2;
      while (i < lines.length && lines[i].includes('|') && lines[i].trim()) rows.push(cells(lines[i++]));
      parent.append(h('div', { class: 'table-wrap' }, h('table', { class: 'table' },
        h('thead', {}, h('tr', {}, rows[0].map((c) => h('th', {}, inline(c))))),
        h('tbody', {}, rows.slice(1).map((r) => h('tr', {}, r.map((c) => h('td', {}, inline(c)))))))));
      continue;
    }
    if (bulletRe.test(line)) {
      i = list(lines, i, parent);
      continue;
    }
    if (/^( {4}|\t)/.test(line)) {
      const body = [];
      while (i < lines.length && (/^( {4}|\t)/.test(lines[i]) || !lines[i].trim())) body.push(lines[i++].replace(/^( {4}|\t)/, ''));
      parent.append(h('pre', { class: 'code' }, body.join('\n').replace(/\n+$/, '')));
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !fenceRe.test(lines[i]) && !headingRe.test(lines[i]) &&
      !quoteRe.test(lines[i]) && !(para.length && bulletRe.test(lines[i])) && !ruleRe.test(lines[i])) para.push(lines[i++].trim());
    if (!para.length) para.push(lines[i++].trim());
    parent.append(h('p', {}, inline(para.join('\n'))));
  }
}

// list reads a list starting at lines[i] (nested by indentation) into
// parent and returns the index after it.
function list(lines, i, parent) {
  const first = lines[i].match(bulletRe);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const el = h(ordered ? 'ol' : 'ul');
  if (ordered && parseInt(first[2], 10) !== 1) el.setAttribute('start', String(parseInt(first[2], 10)));
  while (i < lines.length) {
    const m = lines[i].match(bulletRe);
    if (!m || m[1].length < indent) {
      if (!m && lines[i].trim() && /^\s+/.test(lines[i]) && el.lastChild) {
        el.lastChild.append(' ', inline(lines[i].trim()));
        i++;
        continue;
      }
      break;
    }
    if (m[1].length > indent) {
      i = list(lines, i, el.lastChild || el);
      continue;
    }
    const item = h('li');
    const task = m[3].match(/^\[([ xX])\]\s+(.*)$/);
    if (task) item.append(h('input', { type: 'checkbox', disabled: true, checked: task[1] !== ' ' }), ' ', inline(task[2]));
    else item.append(inline(m[3]));
    el.append(item);
    i++;
    if (i < lines.length && !lines[i].trim() && i + 1 < lines.length && bulletRe.test(lines[i + 1])) i++;
  }
  parent.append(el);
  return i;
}

function cells(row) {
  let r = row.trim();
  if (r.startsWith('|')) r = r.slice(1);
  if (r.endsWith('|') && !r.endsWith('\\|')) r = r.slice(0, -1);
  return r.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, '|'));
}

// inline renders spans of text: code, links, images (as links), strong,
// emphasis, strikethrough and hard line breaks.
const inlineRe = /(`+)([\s\S]*?[^`])\1(?!`)|!\[([^\]]*)\]\(([^)\s]*)(?:\s+"[^"]*")?\)|\[([^\]]+)\]\(([^)\s]*)(?:\s+"[^"]*")?\)|<(https?:\/\/[^>\s]+)>|(\*\*|__)(?=\S)([\s\S]*?\S)\8|(\*|_)(?=\S)([\s\S]*?\S)\10(?![\w])|~~(?=\S)([\s\S]*?\S)~~|\\([\\`*_{}[\]()#+\-.!|~<>])|(\n)/;

export function inline(text) {
  const out = [];
  let s = String(text);
  while (s) {
    const m = s.match(inlineRe);
    if (!m) { out.push(s); break; }
    if (m.index > 0) out.push(s.slice(0, m.index));
    if (m[1]) out.push(h('code', {}, m[2].replace(/^ (.*) $/, '$1')));
    else if (m[4] !== undefined) out.push(link(m[4], 'image: ' + (m[3] || m[4])));
    else if (m[6] !== undefined) out.push(link(m[6], inline(m[5])));
    else if (m[7]) out.push(link(m[7], m[7]));
    else if (m[8]) out.push(h('strong', {}, inline(m[9])));
    else if (m[10]) out.push(h('em', {}, inline(m[11])));
    else if (m[12]) out.push(h('del', {}, inline(m[12])));
    else if (m[13]) out.push(m[13]);
    else if (m[14]) out.push(h('br'));
    s = s.slice(m.index + m[0].length);
  }
  return out;
}

// link is an anchor to an http(s) or mailto URL, opened in a new tab with
// no referrer; any other target is plain text.
function link(url, content) {
  const href = safeHref(url);
  if (href === '#' || !/^(https?|mailto):/i.test(url)) return h('span', { class: 'link-refused', title: 'link not followed: ' + url }, content);
  return h('a', { href, target: '_blank', rel: 'noopener noreferrer nofollow' }, content);
}
