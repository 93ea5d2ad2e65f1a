package console

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// browser is one headless Chromium with a fresh profile, and the errors its
// pages reported.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string // the server's API URL, http://host:port

	mu     sync.Mutex
	errors []string
}

// chromiumPath finds Debian's chromium.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testfs.SkipOrFail(t, "chromium not found (apt-get install chromium)")
	return ""
}

// newBrowser starts Chromium for t against the API at base, with more
// command-line options; t.Cleanup ends it.
func newBrowser(t *testing.T, base string, more ...chromedp.ExecAllocatorOption) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.Headless,
		chromedp.NoSandbox, // root, in CI
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 860),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), append(opts, more...)...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, tcancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { tcancel(); cancel(); acancel() })
	b := &browser{t: t, ctx: ctx, base: base}
	if err := chromedp.Listen(ctx, b.onEvent); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			b.onMessage(m)
		}
	}()
	t.Cleanup(func() { tcancel(); <-done })
	return b
}

// onEvent is unused: chromedp.Listen starts the tab; Console reads the
// messages.
func (b *browser) onEvent(any) {}

// onMessage records what a page reports as an error: an uncaught
// exception, console.error, and the browser's own error log (a script or
// style that did not load, a CSP violation). An API answer the page shows
// by design (a refusal, a 4xx) is logged by Chromium as a network error of
// a /v1/ URL: not counted.
func (b *browser) onMessage(m chromedp.ConsoleMessage) {
	switch m.Type {
	case chromedp.ConsoleException, chromedp.ConsoleError, "assert":
	default:
		return
	}
	if m.Source == "network" && strings.HasPrefix(m.URL, b.base+"/v1/") {
		return
	}
	b.mu.Lock()
	b.errors = append(b.errors, fmt.Sprintf("%s (%s %s)", m, m.Source, m.URL))
	b.mu.Unlock()
}

// stepTimeout bounds one step: a page that does not show what a step waits
// for fails the test in this time.
const stepTimeout = 15 * time.Second

// run runs actions, failing the test with what was being done.
func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v\npage errors: %v", what, err, b.pageErrors())
	}
}

func (b *browser) pageErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}

// checkPage fails the test if the page reported an error, and checks that
// its screenshot is not blank; with QUIVER_UI_SCREENSHOTS set it is saved
// as docs/ui/<name>.png.
func (b *browser) checkPage(name string) {
	b.t.Helper()
	// Let late errors (an asset, a render after the data came) arrive.
	b.run("settle "+name, chromedp.Sleep(100*time.Millisecond))
	if errs := b.pageErrors(); len(errs) > 0 {
		b.t.Fatalf("page %s: errors in the browser:\n%s", name, strings.Join(errs, "\n"))
	}
	shot, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := notBlank(shot); err != nil {
		b.t.Fatalf("page %s: screenshot: %v", name, err)
	}
	if os.Getenv("QUIVER_UI_SCREENSHOTS") != "" {
		dir := filepath.Join("..", "..", "docs", "ui")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".png"), shot, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
}

// notBlank decodes a PNG screenshot and reports an error unless it shows
// something: a rendered page has many colours, a blank or failed one one
// or two.
func notBlank(shot []byte) error {
	if len(shot) == 0 {
		return fmt.Errorf("empty")
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		return err
	}
	r := img.Bounds()
	if r.Dx() < 100 || r.Dy() < 100 {
		return fmt.Errorf("%v: too small", r)
	}
	colours := map[uint32]bool{}
	for y := r.Min.Y; y < r.Max.Y; y += 3 {
		for x := r.Min.X; x < r.Max.X; x += 3 {
			colours[rgb(img, x, y)] = true
		}
	}
	if len(colours) < 8 {
		return fmt.Errorf("%d colours: blank", len(colours))
	}
	return nil
}

func rgb(img image.Image, x, y int) uint32 {
	r, g, b, _ := img.At(x, y).RGBA()
	return r>>8<<16 | g>>8<<8 | b>>8
}

// count returns how many nodes match the CSS selector now.
func (b *browser) count(sel string) int {
	b.t.Helper()
	return eval[int](b, fmt.Sprintf("document.querySelectorAll(%q).length", sel))
}

// text returns the text of the first node matching sel, once visible.
func (b *browser) text(sel string) string {
	b.t.Helper()
	b.run("wait for "+sel, chromedp.WaitVisible(chromedp.CSS(sel)))
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// login opens the console and signs in with token.
func (b *browser) login(token string) {
	b.t.Helper()
	b.run("log in",
		chromedp.Navigate(b.base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Click(chromedp.CSS(`form.login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-card="capacity"]`)),
	)
}

// act opens the dialog of action id, fills its fields and confirms.
func (b *browser) act(id string, fields map[string]string) {
	b.t.Helper()
	dialog := fmt.Sprintf(`form[data-dialog=%q]`, id)
	actions := []chromedp.Action[chromedp.Void]{
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[data-action=%q]`, id)), chromedp.NodeVisible),
		chromedp.WaitVisible(chromedp.CSS(dialog)),
	}
	b.run("open "+id, actions...)
	for name, v := range fields {
		b.fill(fmt.Sprintf(`%s [name=%q]`, dialog, name), v)
	}
	b.run("confirm "+id, chromedp.Click(chromedp.CSS(dialog+` button[name="confirm"]`)))
}

// fill sets the value of the input or select sel as a user's typing or
// choice does: the value, then the input and change events.
func (b *browser) fill(sel, v string) {
	b.t.Helper()
	ok := eval[bool](b, fmt.Sprintf(`(() => {
		const el = document.querySelector(%q);
		if (!el) return false;
		el.value = %q;
		el.dispatchEvent(new Event('input', {bubbles: true}));
		el.dispatchEvent(new Event('change', {bubbles: true}));
		return true;
	})()`, sel, v))
	if !ok {
		b.t.Fatalf("fill %s: no such element", sel)
	}
}

// waitText waits until the text of sel is want.
func (b *browser) waitText(sel, want string) {
	b.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for {
		got := eval[string](b, fmt.Sprintf(`(document.querySelector(%q) || {}).textContent || ''`, sel))
		if strings.TrimSpace(got) == want {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s shows %q, want %q\npage errors: %v", sel, got, want, b.pageErrors())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// goTo navigates the open console to a hash route and waits for sel.
func (b *browser) goTo(hash, sel string) {
	b.t.Helper()
	eval[string](b, fmt.Sprintf("location.hash = %q", hash))
	b.run("go to "+hash, chromedp.WaitVisible(chromedp.CSS(sel)))
}

// scrollTo scrolls the page to sel, its heading above it in view: the
// screenshot checkPage takes is of the window only.
func (b *browser) scrollTo(sel string) {
	b.t.Helper()
	if !eval[bool](b, fmt.Sprintf(`(() => {
		const el = document.querySelector(%q);
		if (!el) return false;
		el.scrollIntoView({block: 'start'});
		window.scrollBy(0, -60);
		return true;
	})()`, sel)) {
		b.t.Fatalf("scroll to %s: no such element", sel)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}
