// The operator console in a real browser (Debian's chromium through
// playwright-core), against the sidecar tests/console_pgtest.cc started:
// a business token is refused; an operator's opens the overview, whose
// charts draw; the UNKNOWN record CONSOLE_KEY is found in the queue, opened
// and resolved to FAILED with a reason; the audit row shows. No console
// errors, nothing from another origin; a screenshot of each page is kept in
// CONSOLE_SCREENSHOTS.
//
// Environment: CONSOLE_URL (http://127.0.0.1:port), CONSOLE_OPS_TOKEN,
// CONSOLE_BUSINESS_TOKEN, CONSOLE_TENANT, CONSOLE_KEY, CONSOLE_SCREENSHOTS
// (a directory), CHROMIUM (default /usr/bin/chromium).
"use strict";

const fs = require("fs");
const path = require("path");
const { chromium } = require("playwright-core");

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(name + " is not set");
  return v;
};
const base = env("CONSOLE_URL");
const shots = env("CONSOLE_SCREENSHOTS");
const tenant = env("CONSOLE_TENANT");
const key = env("CONSOLE_KEY");
const reason = "no charge in the ledger (browser test)";

function check(ok, what) {
  if (!ok) throw new Error("failed: " + what);
  console.log("ok: " + what);
}

async function main() {
  fs.mkdirSync(shots, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    // The test runs as root in CI containers, where chromium's sandbox
    // cannot start.
    args: ["--no-sandbox"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
    const errors = [];
    const foreign = [];
    let refusing = true;
    page.on("console", (m) => {
      if (m.type() !== "error") return;
      // The refused token's 401 and 403 answers are logged by the browser
      // itself; nothing else may be.
      if (refusing && /status of 40[13]/.test(m.text())) return;
      errors.push(m.text());
    });
    page.on("pageerror", (e) => errors.push(e.message));
    page.on("request", (r) => {
      if (!r.url().startsWith(base + "/")) foreign.push(r.url());
    });
    const shot = (name) => page.screenshot({ path: path.join(shots, name + ".png"), fullPage: true });

    // A business token is refused.
    await page.goto(base + "/");
    await page.getByTestId("token").waitFor();
    await page.getByTestId("token").fill(env("CONSOLE_BUSINESS_TOKEN"));
    await page.getByTestId("token-submit").click();
    await page.locator("#login-error", { hasText: "operator" }).waitFor();
    check((await page.locator("#nav").isHidden()), "a business token is refused on the page");
    await shot("login-refused");

    // Every form control has a label.
    const unlabelled = await page.evaluate(() =>
      [...document.querySelectorAll("input, select, textarea")]
        .filter((e) => e.labels === null || e.labels.length === 0).map((e) => e.id));
    check(unlabelled.length === 0, "every control has a label (" + unlabelled.join(", ") + ")");

    // An operator's token, typed and submitted with the keyboard.
    await page.getByTestId("token").focus();
    await page.keyboard.type(env("CONSOLE_OPS_TOKEN"));
    await page.keyboard.press("Enter");
    await page.locator("#overview").waitFor({ state: "visible" });
    refusing = false;
    const stored = await page.evaluate(() => ({ session: sessionStorage.length, cookies: document.cookie }));
    check(stored.session === 1 && stored.cookies === "", "the token is in sessionStorage, no cookie");

    // The charts fill as samples arrive (the test runs a load meanwhile).
    await page.waitForFunction(() => {
      const canvases = [...document.querySelectorAll("[data-testid=chart]")];
      return canvases.length === 7 && canvases.every((c) => {
        const chart = Chart.getChart(c);
        return chart && chart.data.labels.length >= 3;
      });
    }, null, { timeout: 20000 });
    const drawn = await page.evaluate(() => [...document.querySelectorAll("[data-testid=chart]")].map((c) => {
      const chart = Chart.getChart(c);
      const points = chart.data.datasets.reduce((n, d) => n + d.data.filter((v) => v !== null).length, 0);
      const pixels = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      let ink = 0;
      for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) ink++;
      return { name: c.dataset.chart, points, ink };
    }));
    for (const c of drawn) check(c.ink > 0, "chart " + c.name + " draws");
    for (const c of drawn.filter((d) => d.name !== "redis")) check(c.points > 0, "chart " + c.name + " has data");
    const begins = await page.evaluate(() => {
      const chart = Chart.getChart(document.querySelector("[data-chart=begins]"));
      return chart.data.datasets.some((d) => d.data.some((v) => v > 0));
    });
    check(begins, "the Begin chart moves with the load");
    await shot("overview");

    // The queue, filtered by tenant, has the record.
    await page.getByRole("link", { name: "UNKNOWN queue" }).click();
    await page.getByLabel("Tenant").fill(tenant);
    await page.getByRole("button", { name: "Apply" }).click();
    const row = page.getByTestId("record-row").filter({ hasText: key });
    await row.waitFor();
    check((await page.locator("#queue-count").textContent()).includes("UNKNOWN record"), "the queue counts its rows");
    await shot("queue");

    // Text keeps a contrast ratio of at least 4.5:1 (WCAG AA).
    const low = await page.evaluate(() => {
      const rgb = (c) => c.match(/[\d.]+/g).map(Number);
      const lum = ([r, g, b]) => [r, g, b].map((v) => {
        v /= 255;
        return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
      }).reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
      const background = (e) => {
        for (; e; e = e.parentElement) {
          const c = rgb(getComputedStyle(e).backgroundColor);
          if (c.length < 4 || c[3] > 0) return c;
        }
        return [255, 255, 255];
      };
      const bad = [];
      for (const e of document.querySelectorAll("h1, h2, a, button, label, th, td, p, figcaption, li")) {
        if (!e.offsetParent || !e.textContent.trim()) continue;
        const [l1, l2] = [lum(rgb(getComputedStyle(e).color)), lum(background(e))].sort((a, b) => b - a);
        const ratio = (l1 + 0.05) / (l2 + 0.05);
        if (ratio < 4.5) bad.push(e.tagName + " \"" + e.textContent.trim().slice(0, 20) + "\" " + ratio.toFixed(2));
      }
      return bad;
    });
    check(low.length === 0, "text contrast at least 4.5:1 (" + low.join("; ") + ")");

    // Its page, reached with the keyboard, then Resolve with a reason and
    // a confirmation.
    await row.getByRole("link", { name: key }).focus();
    await page.keyboard.press("Enter");
    await page.locator("#record-title", { hasText: key }).waitFor();
    check((await page.getByTestId("audit").locator("li").count()) >= 1, "the audit timeline shows the record's history");
    await page.getByTestId("resolve-to").selectOption("STATUS_FAILED");
    await page.getByTestId("resolve").click();
    check(await page.getByTestId("resolve-confirm").isHidden(), "no confirmation without a reason");
    await page.getByTestId("reason").fill(reason);
    await page.getByTestId("resolve").click();
    await page.getByTestId("resolve-confirm").waitFor({ state: "visible" });
    await shot("resolve-confirm");
    await page.getByTestId("resolve-confirm").click();
    const row2 = page.getByTestId("audit").locator("li", { hasText: "UNKNOWN → FAILED by ops" });
    await row2.waitFor();
    check((await row2.textContent()).includes(reason), "the audit row has the reason");
    check((await page.locator("#record-fields").textContent()).includes("FAILED"), "the record shows FAILED");
    await shot("record-resolved");

    check(errors.length === 0, "no console errors (" + errors.join("; ") + ")");
    check(foreign.length === 0, "nothing loads from another origin (" + foreign.join(", ") + ")");
  } finally {
    await browser.close();
  }
}

main().then(() => console.log("browser test passed"), (err) => {
  console.error(err.stack || String(err));
  process.exit(1);
});
