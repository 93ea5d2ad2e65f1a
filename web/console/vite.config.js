import { defineConfig } from 'vite';

// The console is served at /ui/ by `quiver server` (internal/console), which
// embeds the build output committed in internal/console/dist.
export default defineConfig({
  base: '/ui/',
  build: {
    outDir: '../../internal/console/dist',
    emptyOutDir: true,
    assetsDir: 'assets',
    sourcemap: false,
    modulePreload: { polyfill: false },
  },
});
