// Opens an HTML report in Debian's Chromium (headless) and prints what a person
// would see as JSON: console messages, page errors, failed requests, and every
// chart's rendered size. Optionally saves a full-page screenshot.
//   node render_report.js REPORT.html [SCREENSHOT.png]
const path = require('path');
const { chromium } = require('playwright-core');

(async () => {
  const [page_file, screenshot] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.VAIQ_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
  });
  const result = { console: [], page_errors: [], failed_requests: [], charts: [], sections: [] };
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.on('console', (m) => result.console.push({ type: m.type(), text: m.text() }));
    page.on('pageerror', (e) => result.page_errors.push(String(e)));
    page.on('requestfailed', (r) => result.failed_requests.push(r.url()));
    await page.goto('file://' + path.resolve(page_file), { waitUntil: 'load' });
    result.title = await page.title();
    result.charts = await page.$$eval('svg', (svgs) => svgs.map((s) => {
      const box = s.getBoundingClientRect();
      return { class: s.getAttribute('class'), width: box.width, height: box.height,
               marks: s.querySelectorAll('rect, circle').length };
    }));
    result.sections = await page.$$eval('section', (all) => all.map((s) => s.id));
    if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(result));
})().catch((e) => { console.error(String(e)); process.exit(1); });
