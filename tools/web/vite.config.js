// The bundle is embedded into the coli binary at build time: no network access from the page,
// every asset local, relative paths so it works under any mount point.
import { defineConfig } from 'vite';

export default defineConfig({
  base: './',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    assetsInlineLimit: 0,
    sourcemap: false,
    reportCompressedSize: false,
  },
});
