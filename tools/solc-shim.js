#!/usr/bin/env node
// Lets forge use npm's solcjs as its compiler: forge cannot download native solc here.
// `--version` prints the version line forge parses; otherwise standard JSON in, standard JSON out,
// with imports resolved against --base-path, --include-path and the current directory.
'use strict';
const fs = require('fs');
const path = require('path');
const solc = require(path.join(__dirname, '..', 'node_modules', 'solc'));

const args = process.argv.slice(2);
if (args.includes('--version')) {
  const v = solc.version().replace(/\.Emscripten\.clang$/, '');
  process.stdout.write('solc, the solidity compiler commandline interface\n');
  process.stdout.write(`Version: ${v}.Linux.g++\n`);
  process.exit(0);
}

const roots = [process.cwd()];
for (let i = 0; i < args.length; i++) {
  if ((args[i] === '--base-path' || args[i] === '--include-path') && args[i + 1]) {
    roots.push(path.resolve(args[i + 1]));
  }
}

function findImports(p) {
  const candidates = path.isAbsolute(p) ? [p] : roots.map((r) => path.join(r, p));
  for (const c of candidates) {
    try {
      return { contents: fs.readFileSync(c, 'utf8') };
    } catch (_) { /* try the next root */ }
  }
  return { error: `File not found: ${p}` };
}

const input = fs.readFileSync(0, 'utf8');
process.stdout.write(solc.compile(input, { import: findImports }));
