// A JavaScript call case: run the program (prog.js) as a CommonJS module, call its entry point
// (a function it defines or exports, else a method of a fresh `new Solution()`, LeetCode's form)
// with the arguments on stdin (one JSON array), and print the result as JSON on stdout. Whatever
// the program prints goes to stderr. The expected value never reaches this process: the
// supervisor compares the printed result with it (supervisor.py, matching.values_match). Written
// into the run's directory by the supervisor; node runs it as `node call_harness.js NAME`.
'use strict';
const fs = require('fs');
const Module = require('module');
const path = require('path');

const name = process.argv[2];
const args = JSON.parse(fs.readFileSync(0, 'utf8'));
const stdoutWrite = process.stdout.write.bind(process.stdout);
process.stdout.write = (chunk, ...rest) => process.stderr.write(chunk, ...rest);

const file = path.resolve('prog.js');
const program = new Module(file, null);
program.filename = file;
program.paths = Module._nodeModulePaths(path.dirname(file));
// The lookup is compiled with the program, in its scope: a top-level `function add` or `class
// Solution` is found by name even when the program exports nothing.
const lookup = `\n;module.exports.__entry__ = (() => {
  if (typeof ${name} === 'function') return ${name};
  if (typeof module.exports.${name} === 'function') return module.exports.${name};
  if (typeof Solution === 'function') return (...a) => { const s = new Solution(); return s.${name}(...a); };
  return undefined;
})();\n`;
program._compile(fs.readFileSync(file, 'utf8') + lookup, file);
const entry = program.exports.__entry__;
if (typeof entry !== 'function') {
  process.stderr.write(`ReferenceError: the program defines neither ${name} nor class Solution\n`);
  process.exit(1);
}
Promise.resolve(entry(...args)).then((value) => {
  const text = JSON.stringify(value === undefined ? null : value);
  stdoutWrite(text + '\n', () => process.exit(0));
}, (error) => {
  process.stderr.write(String(error && error.stack || error) + '\n');
  process.exit(1);
});
