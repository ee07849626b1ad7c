// ESLint flat config for the whole workspace (`pnpm lint`).
//
// typescript-eslint's recommended rules, without type information. The
// type-aware set (recommendedTypeChecked) makes ESLint build a TypeScript
// program per package again: about 4x the CPU time and 600 MB on the 2-core
// CI machine, for checks that the strict `tsc -b` of `pnpm build` mostly
// makes already.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    // Build output, dependencies and generated bench files are not ours to lint.
    ignores: ['**/dist/**', '**/node_modules/**', '.tools/**', '.turbo/**', 'bench/results/**'],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: 'module',
      // Everything here runs on Node; these are the globals plain JS files use.
      globals: { process: 'readonly', console: 'readonly', Buffer: 'readonly' },
    },
    rules: {
      // A leading `_` marks a name a signature or a destructuring needs but the body does not.
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
      // New in ESLint 10's recommended set: any `throw new Error` inside a catch
      // must carry `{ cause }`. Tally's errors put what went wrong into their
      // one-line message (what an operator reads), and some throws in a catch
      // are not caused by the caught error at all (a SHA mismatch after a
      // successful SCRIPT LOAD), so the rule reports noise, not lost causes.
      'preserve-caught-error': 'off',
    },
  },
  {
    // chai's property assertions (`expect(x).to.be.true`, `.to.be.NaN`) are expressions by design.
    files: ['**/test/**/*.ts', '**/test-faults/**/*.ts'],
    rules: {
      '@typescript-eslint/no-unused-expressions': 'off',
    },
  },
);
