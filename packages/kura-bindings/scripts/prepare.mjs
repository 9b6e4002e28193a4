// Builds dist/ when the package is installed from a clone (`npm install path/to/kura-bindings`),
// where dist/ is not committed: installs the package's own dependencies (TypeScript among
// them) from its lock file, then compiles. A build already present is kept.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const run = (command, args) => execFileSync(command, args, { cwd: root, stdio: "inherit" });
if (!existsSync(join(root, "node_modules", "typescript"))) {
  run("npm", ["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]);
}
run(process.execPath, [join(root, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"]);
