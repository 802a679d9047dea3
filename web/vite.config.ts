import { defineConfig } from 'vite';

// The build lands in the api crate, which embeds it with include_bytes!: fixed file names
// (the Rust side names each asset), no hashes, no chunks, no source maps, so that
// `npm run build` reproduces the checked-in files byte for byte.
export default defineConfig({
  base: './',
  build: {
    outDir: '../crates/api/dashboard',
    emptyOutDir: true,
    assetsDir: '',
    modulePreload: false,
    sourcemap: false,
    target: 'es2022',
    rolldownOptions: {
      output: {
        entryFileNames: 'app.js',
        chunkFileNames: 'app-[name].js',
        assetFileNames: 'app[extname]',
      },
    },
  },
});
