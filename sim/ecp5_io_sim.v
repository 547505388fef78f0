// Two-state models of the ECP5 IO buffers that amaranth's Lattice platform instantiates for
// the ULX3S pins (IB, OB, OBZ, BB), for the pin-level board simulation on Verilator
// (ringkv.sim.board_harness). They follow yosys' ECP5 cell models (share/ecp5/cells_io.vh on
// TRELLIS_IO in common_sim.vh) in every case the board top uses, but do not drive an input
// pad with 'z' (TRELLIS_IO's `assign B = 1'bz` in INPUT mode: Verilator rejects it,
// ASSIGNIN and "tristate in top-level IO"): a pad whose output enable is off (T = 1) reads
// as the level the testbench drives, and an output pad with T = 1 is driven to 1 here
// (a pulled-up line) where the real pad floats.
//
// A bidirectional pad (BB) cannot be one two-state top-level net driven from both sides, so
// its two sides are split: B is the line's external side only, an input that the testbench
// drives (the card's bit when the card drives, else 1: the pad's pull-up), and the FPGA's
// own drive (T, I) leaves the top through two extra ports per pin that
// board_harness.expose_bidir_pads adds ({pin}__fpga_oe = ~T, {pin}__fpga_o = I). What the
// FPGA reads (O) is the wired line: its own I while it drives (T = 0), else B. Both sides
// driving at once is a conflict on the real line; the testbench flags it (it sees both).
module IB (input I, output O);
  assign O = I;
endmodule

module OB (input I, output O);
  assign O = I;
endmodule

module OBZ (input I, input T, output O);
  assign O = T ? 1'b1 : I;
endmodule

module BB (input I, input T, output O, inout B);
  assign O = T ? B : I;
endmodule
