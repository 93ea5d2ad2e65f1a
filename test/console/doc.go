// Package console tests the web console (internal/console, web/console) in
// a real browser: Debian's Chromium, headless, driven from Go through the
// DevTools protocol (chromedp), against the real `quiver server` binary,
// built once by TestMain.
//
//   - console_test.go: log in with a token, create a volume, snapshot it,
//     clone it live and from the snapshot, roll it back, delete; a bad
//     name shows the server's own message, as does a rollback under a
//     connected writer; a monitor token sees no action button (and the API
//     refuses it); a tenant's token sees its own volumes only;
//   - list_test.go: the volume list with many volumes (10,000 by default)
//     renders, searches and sorts, timed;
//   - live_test.go: the live I/O chart under fio and a QoS limit, a
//     volume's edits, the jobs page and the audit log;
//   - vm_test.go: a volume's lineage, node for node as the API's volumes
//     describe it, and its writer and fenced sides through a writer move;
//   - protection_test.go: its backups (on an S3 server) and DR relationship
//     (to a second server), and a restore cancelled from the jobs page;
//   - copies_test.go: a copy's resync followed in the open page, on a
//     cluster of two nodes on loopback;
//   - tls_test.go: the console over HTTPS, trusting the test's CA.
//
// Every page is checked for rendering: no console error or uncaught
// exception (API refusals the page shows by design aside), and a
// screenshot that is not blank. QUIVER_UI_SCREENSHOTS=1 saves the
// screenshots in docs/ui (make console-screenshots).
//
// Without chromium the tests skip, and fail when CI is set.
package console
